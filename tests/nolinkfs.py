"""A FUSE file system without hard links, passing everything else through to a directory: what a local
namespace location on a FUSE mount (a Databricks volume) offers. Run as `python tests/nolinkfs.py BACKING MOUNT`
(mfusepy, a test dependency, with Debian's fuse3 for the mount, which `make install` installs)."""
from __future__ import annotations

import errno
import os
import sys

import mfusepy as fuse


class NoLinks(fuse.Operations):
    """Every call on the mount done on the backing directory, but link, which is refused (EPERM)."""

    use_ns = True

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        return {key: getattr(st, key) for key in ("st_atime_ns", "st_ctime_ns", "st_mtime_ns", "st_gid", "st_mode",
                                                  "st_nlink", "st_size", "st_uid")} | {
            "st_atime": st.st_atime_ns, "st_ctime": st.st_ctime_ns, "st_mtime": st.st_mtime_ns}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._path(path))]

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        os.rmdir(self._path(path))

    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT, mode)

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        os.truncate(self._path(path), length)

    def release(self, path, fh):
        os.close(fh)

    def unlink(self, path):
        os.unlink(self._path(path))

    def rename(self, old, new):
        os.rename(self._path(old), self._path(new))

    def fsync(self, path, datasync, fh):
        os.fsync(fh)

    def utimens(self, path, times=None):
        os.utime(self._path(path), ns=times)

    def access(self, path, amode):
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)

    def link(self, target, source):
        raise fuse.FuseOSError(errno.EPERM)


if __name__ == "__main__":
    fuse.FUSE(NoLinks(sys.argv[1]), sys.argv[2], foreground=True, nothreads=True)
