package dev.onceflow.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's checksummed local file system, setting a file's permission through java.nio instead of a forked
 * {@code chmod}. Without Hadoop's native library (pip's pyspark has none) RawLocalFileSystem forks a process for
 * every file it creates: a streaming job's checkpoint (offsets, commits, each state partition's delta, each with its
 * checksum file) forked about five a second at 200 records/s. onceflow.runtime.local_fs sets it as fs.file.impl for
 * a checkpoint on this machine's file system. Everything else is Hadoop's own.
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  public static class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      // the native library, or a bit NIO cannot set (sticky), or an ACL bit: Hadoop's own way
      if (NativeIO.isAvailable() || permission.getStickyBit() || permission.getAclBit()) {
        super.setPermission(p, permission);
        return;
      }
      try {
        Files.setPosixFilePermissions(
            pathToFile(p).toPath(), PosixFilePermissions.fromString(permission.toString().substring(0, 9)));
      } catch (UnsupportedOperationException e) { // a file system without POSIX permissions
        super.setPermission(p, permission);
      }
    }
  }
}
