"""The compiler behind App.java (onceflow.runtime.javac): Java sources to a jar, once per content, javac's own words
when it refuses them. The access-log rules compiled this way and called from Spark: test_access_log_parsing.py."""

import zipfile

import pytest

from onceflow import config
from onceflow.runtime import javac

SOURCE = """package dev.example;
public final class Hello implements org.apache.spark.sql.api.java.UDF1<String, String> {
  public String call(String s) { return "hello " + s; }
}
"""


def test_sources_compile_once_per_content_against_spark(tmp_path):
    s = config.load(env={}, jvm_dir=tmp_path / "jvm")
    src = tmp_path / "src" / "dev" / "example" / "Hello.java"
    src.parent.mkdir(parents=True)
    src.write_text(SOURCE)
    against = javac.classpath(["spark-sql-api_*.jar", "scala-library-*.jar"])
    jar = javac.jar(s, "example", javac.sources([tmp_path / "src"]), against)
    assert "dev/example/Hello.class" in zipfile.ZipFile(jar).namelist()
    built = jar.stat().st_mtime_ns
    assert javac.jar(s, "example", javac.sources([tmp_path / "src"]), against) == jar
    assert jar.stat().st_mtime_ns == built  # not built again
    src.write_text(SOURCE.replace("hello ", "hi "))
    again = javac.jar(s, "example", javac.sources([tmp_path / "src"]), against)
    assert again != jar and again.exists()  # a changed source is another jar


def test_a_source_javac_refuses_says_why(tmp_path):
    s = config.load(env={}, jvm_dir=tmp_path / "jvm")
    src = tmp_path / "Broken.java"
    src.write_text("public final class Broken { int x = ; }\n")
    with pytest.raises(javac.JavacError, match="javac refused") as e:
        javac.jar(s, "broken", [src], [])
    assert "Broken.java" in str(e.value)
    assert not list((tmp_path / "jvm").rglob("*.jar"))
