"""Certificates of the secured embedded stack, made with the JDK's keytool at first start and kept under var/.

A private CA (var/kafka/tls/ca.pem, what clients trust: ONCEFLOW_KAFKA_CA_FILE) signs one certificate for the
brokers, valid for the loopback names (localhost, 127.0.0.1, ::1) and for both ends of a connection: brokers
present it to clients, and to each other on the controller listener, where it is also their identity
(User:CN=onceflow-kafka, a super user). The stores' password is random, in a 0600 file next to them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from onceflow.config import Settings
from onceflow.wire import OnceflowError
from onceflow_dev.private_files import write_private

BROKER_DN = "CN=onceflow-kafka"
BROKER_PRINCIPAL = f"User:{BROKER_DN}"
SAN = "SAN=dns:localhost,ip:127.0.0.1,ip:0:0:0:0:0:0:0:1"


class TlsError(OnceflowError):
    pass


def home(settings: Settings) -> Path:
    return settings.var_dir / "kafka" / "tls"


def ca_pem(settings: Settings) -> Path:
    return home(settings) / "ca.pem"


def keystore(settings: Settings) -> Path:
    return home(settings) / "broker.p12"


def store_password(settings: Settings) -> str:
    return (home(settings) / "store.password").read_text().strip()


def ensure(settings: Settings) -> Path:
    """Make the CA and the brokers' keystore once; later starts reuse them. Returns the CA's PEM."""
    if ca_pem(settings).exists() and keystore(settings).exists():
        return ca_pem(settings)
    keytool = shutil.which("keytool")
    if not keytool:
        raise TlsError("keytool is not on PATH: install a JDK (apt-get install openjdk-17-jre-headless)")
    d = home(settings)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    os.chmod(d, 0o700)
    pw = secrets.token_urlsafe(18)
    pw_file = d / "store.password"
    write_private(pw_file, pw)
    # keytool reads the password from that file (-storepass:file): it is on no command line
    sp, kp = ("-storepass:file", str(pw_file)), ("-keypass:file", str(pw_file))
    ca, broker = d / "ca.p12", keystore(settings)

    def run(*args: str, stdin: str | None = None) -> str:
        r = subprocess.run([keytool, *args], input=stdin, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise TlsError(f"keytool {args[0]} failed: {r.stdout}{r.stderr}")
        return r.stdout

    common = ("-storetype", "PKCS12", *sp, *kp, "-keyalg", "RSA", "-keysize", "2048")
    run("-genkeypair", "-alias", "ca", "-dname", "CN=onceflow-ca", "-ext", "bc:c", "-validity", "3650",
        "-keystore", str(ca), *common)  # fmt: skip
    ca_pem(settings).write_text(run("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), *sp))
    run("-genkeypair", "-alias", "broker", "-dname", BROKER_DN, "-ext", SAN, "-validity", "3650",
        "-keystore", str(broker), *common)  # fmt: skip
    csr = run("-certreq", "-alias", "broker", "-keystore", str(broker), *sp)
    signed = run(
        "-gencert", "-alias", "ca", "-keystore", str(ca), *sp, "-rfc", "-validity", "3650",
        "-ext", SAN, "-ext", "ku:c=digitalSignature,keyEncipherment", "-ext", "eku=serverAuth,clientAuth",
        stdin=csr,
    )  # fmt: skip
    for alias, pem in (("ca", ca_pem(settings)), ("broker", d / "broker.pem")):
        if alias == "broker":
            pem.write_text(signed)
        run("-importcert", "-noprompt", "-alias", alias, "-file", str(pem), "-keystore", str(broker),
            *sp)  # fmt: skip
    ca.unlink()  # the CA's key signs nothing more
    return ca_pem(settings)
