"""A small ONC RPC (RFC 5531) client for protocol tests: MOUNT v3 and NFSv3 (RFC 1813).

Deliberately explicit: every call can be built as bytes, sent raw, split into
record-marking fragments, retransmitted with the same XID, or sent from a
chosen source address / port.

    from rig.rpc import RpcClient, Nfs3Client, auth_sys, NFS3_OK

    with Nfs3Client("127.0.0.1", port, cred=auth_sys(0, 0)) as c:
        root = c.mnt("/srv/export").fh             # MOUNT MNT -> file handle
        r = c.create(root, "f", how="guarded")      # r.status, r.fh, r.attr
        r = c.write(r.fh, 0, b"data", stable="file_sync")
        print(r.committed, r.verf.hex())

    # raw level
    rc = RpcClient("127.0.0.1", port, proto="udp", src_port="privileged")
    reply = rc.call(100003, 3, 1, args=b"...")      # -> Reply
    reply.accepted, reply.accept_stat, reply.results

Transports: ``proto="tcp"`` (record marking, one reply read per call) or
``"udp"`` (one datagram each way).  ``src_addr`` binds the local address
(any 127.x.y.z works on Linux loopback), ``src_port`` is ``None`` (kernel's
choice), an int, or ``"privileged"`` (a free port below 1024; needs root).
"""

from __future__ import annotations

import itertools
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Optional


# ---------------------------------------------------------------- constants

RPC_VERSION = 2
MSG_CALL, MSG_REPLY = 0, 1
MSG_ACCEPTED, MSG_DENIED = 0, 1
# accept_stat
SUCCESS, PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR = range(6)
# reject_stat
RPC_MISMATCH, AUTH_ERROR = 0, 1
# auth_stat
AUTH_OK, AUTH_BADCRED, AUTH_REJECTEDCRED, AUTH_BADVERF, AUTH_REJECTEDVERF, AUTH_TOOWEAK = range(6)
# auth flavors
AUTH_NONE, AUTH_SYS = 0, 1

PMAP_PROG, MOUNT_PROG, NFS_PROG = 100000, 100005, 100003
MOUNT_V3, NFS_V3 = 3, 3

# MOUNT v3 procedures / status
MOUNTPROC_NULL, MOUNTPROC_MNT, MOUNTPROC_DUMP, MOUNTPROC_UMNT, MOUNTPROC_UMNTALL, MOUNTPROC_EXPORT = range(6)
MNT3_OK, MNT3ERR_PERM, MNT3ERR_NOENT, MNT3ERR_ACCES, MNT3ERR_NOTDIR, MNT3ERR_INVAL = 0, 1, 2, 13, 20, 22

# NFSv3 procedures
(NFSPROC3_NULL, NFSPROC3_GETATTR, NFSPROC3_SETATTR, NFSPROC3_LOOKUP, NFSPROC3_ACCESS,
 NFSPROC3_READLINK, NFSPROC3_READ, NFSPROC3_WRITE, NFSPROC3_CREATE, NFSPROC3_MKDIR,
 NFSPROC3_SYMLINK, NFSPROC3_MKNOD, NFSPROC3_REMOVE, NFSPROC3_RMDIR, NFSPROC3_RENAME,
 NFSPROC3_LINK, NFSPROC3_READDIR, NFSPROC3_READDIRPLUS, NFSPROC3_FSSTAT, NFSPROC3_FSINFO,
 NFSPROC3_PATHCONF, NFSPROC3_COMMIT) = range(22)

# nfsstat3 (the ones tests look at)
NFS3_OK = 0
NFS3ERR_PERM = 1
NFS3ERR_NOENT = 2
NFS3ERR_IO = 5
NFS3ERR_FBIG = 27
NFS3ERR_ACCES = 13
NFS3ERR_EXIST = 17
NFS3ERR_NOTDIR = 20
NFS3ERR_ISDIR = 21
NFS3ERR_INVAL = 22
NFS3ERR_ROFS = 30
NFS3ERR_NAMETOOLONG = 63
NFS3ERR_NOTEMPTY = 66
NFS3ERR_STALE = 70
NFS3ERR_BADHANDLE = 10001
NFS3ERR_NOTSUPP = 10004
NFS3ERR_BADTYPE = 10007

# ftype3
NF3REG, NF3DIR, NF3BLK, NF3CHR, NF3LNK, NF3SOCK, NF3FIFO = range(1, 8)
# stable_how
UNSTABLE, DATA_SYNC, FILE_SYNC = 0, 1, 2
_STABLE = {"unstable": UNSTABLE, "data_sync": DATA_SYNC, "file_sync": FILE_SYNC}
# ACCESS3 bits (RFC 1813 section 3.3.4)
ACCESS3_READ, ACCESS3_LOOKUP, ACCESS3_MODIFY, ACCESS3_EXTEND, ACCESS3_DELETE, ACCESS3_EXECUTE = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20)
ACCESS3_ALL = 0x3F
# FSINFO properties
FSF3_LINK, FSF3_SYMLINK, FSF3_HOMOGENEOUS, FSF3_CANSETTIME = 0x1, 0x2, 0x8, 0x10
# portmap v2 procedures / protocols
PMAPPROC_NULL, PMAPPROC_SET, PMAPPROC_UNSET, PMAPPROC_GETPORT, PMAPPROC_DUMP = range(5)
IPPROTO_TCP, IPPROTO_UDP = 6, 17
# createmode3
UNCHECKED, GUARDED, EXCLUSIVE = 0, 1, 2
_CREATEMODE = {"unchecked": UNCHECKED, "guarded": GUARDED, "exclusive": EXCLUSIVE}


class RpcError(RuntimeError):
    """The call was not accepted with SUCCESS (carries the parsed Reply)."""

    def __init__(self, msg, reply=None):
        super().__init__(msg)
        self.reply = reply


# ---------------------------------------------------------------- XDR

class Packer:
    """XDR encoder (RFC 4506): big-endian 4-byte units, opaque data padded to 4."""

    def __init__(self):
        self.parts: list[bytes] = []

    def u32(self, v: int) -> "Packer":
        self.parts.append(struct.pack(">I", v & 0xFFFFFFFF))
        return self

    def u64(self, v: int) -> "Packer":
        self.parts.append(struct.pack(">Q", v & 0xFFFFFFFFFFFFFFFF))
        return self

    def bool(self, v: bool) -> "Packer":
        return self.u32(1 if v else 0)

    def fixed(self, b: bytes) -> "Packer":
        """Fixed-length opaque (no length word), padded."""
        self.parts.append(bytes(b) + b"\0" * (-len(b) % 4))
        return self

    def opaque(self, b) -> "Packer":
        """Variable-length opaque / string: length word, data, padding."""
        if isinstance(b, str):
            b = b.encode()
        self.u32(len(b))
        return self.fixed(b)

    string = opaque

    def raw(self, b: bytes) -> "Packer":
        self.parts.append(bytes(b))
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


class Unpacker:
    """XDR decoder; raises ValueError when the data runs out."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"XDR underflow: need {n} bytes at {self.pos}, have {len(self.data) - self.pos}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self._take(8))[0]

    def bool(self) -> bool:
        return self.u32() != 0

    def fixed(self, n: int) -> bytes:
        b = self._take(n)
        self._take(-n % 4)
        return b

    def opaque(self) -> bytes:
        return self.fixed(self.u32())

    def rest(self) -> bytes:
        b = self.data[self.pos:]
        self.pos = len(self.data)
        return b

    def done(self) -> bool:
        return self.pos >= len(self.data)


# ---------------------------------------------------------------- credentials

@dataclass(frozen=True)
class Cred:
    """An opaque_auth: flavor + body bytes (used for both credential and verifier)."""
    flavor: int
    body: bytes = b""


AUTH_NONE_CRED = Cred(AUTH_NONE)


def auth_none() -> Cred:
    return AUTH_NONE_CRED


def auth_sys(uid: int = 0, gid: int = 0, gids=(), machine: str = "nasd-test", stamp: int = 0) -> Cred:
    """AUTH_SYS (RFC 5531 appendix A).  Any number of gids may be given, so tests
    can send more than the protocol's 16."""
    p = Packer().u32(stamp).string(machine).u32(uid).u32(gid).u32(len(gids))
    for g in gids:
        p.u32(g)
    return Cred(AUTH_SYS, p.bytes())


def auth_raw(flavor: int, body: bytes = b"") -> Cred:
    """Any flavor with any body (e.g. an unknown flavor)."""
    return Cred(flavor, body)


# ---------------------------------------------------------------- messages

def build_call(xid: int, prog: int, vers: int, proc: int, args: bytes = b"",
               cred: Cred = AUTH_NONE_CRED, verf: Cred = AUTH_NONE_CRED,
               rpcvers: int = RPC_VERSION) -> bytes:
    """The bytes of a CALL message (no record mark)."""
    p = Packer().u32(xid).u32(MSG_CALL).u32(rpcvers).u32(prog).u32(vers).u32(proc)
    p.u32(cred.flavor).opaque(cred.body)
    p.u32(verf.flavor).opaque(verf.body)
    return p.bytes() + args


def frame(msg: bytes, fragments: int = 1) -> bytes:
    """Record marking (RFC 5531 section 11): split ``msg`` into ``fragments``
    pieces, each preceded by a 4-byte header; the last has the high bit set."""
    fragments = max(1, min(fragments, max(1, len(msg))))
    step = -(-len(msg) // fragments)
    pieces = [msg[i:i + step] for i in range(0, len(msg), step)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        last = 0x80000000 if i == len(pieces) - 1 else 0
        out.append(struct.pack(">I", last | len(piece)) + piece)
    return b"".join(out)


@dataclass
class Reply:
    """A parsed REPLY.

    ``accepted``: MSG_ACCEPTED; then ``accept_stat`` (SUCCESS...), ``mismatch``
    = (low, high) for PROG_MISMATCH, ``results`` = the procedure's result bytes.
    Otherwise ``reject_stat`` (RPC_MISMATCH/AUTH_ERROR), ``mismatch`` for
    RPC_MISMATCH, ``auth_stat`` for AUTH_ERROR.  ``raw`` = the whole message."""
    xid: int
    accepted: bool
    raw: bytes
    accept_stat: Optional[int] = None
    reject_stat: Optional[int] = None
    auth_stat: Optional[int] = None
    mismatch: Optional[tuple] = None
    verf: Optional[Cred] = None
    results: bytes = b""

    @property
    def success(self) -> bool:
        return self.accepted and self.accept_stat == SUCCESS

    def unpacker(self) -> Unpacker:
        return Unpacker(self.results)


def parse_reply(msg: bytes) -> Reply:
    u = Unpacker(msg)
    xid = u.u32()
    mtype = u.u32()
    if mtype != MSG_REPLY:
        raise ValueError(f"not a reply (msg_type {mtype})")
    stat = u.u32()
    if stat == MSG_ACCEPTED:
        verf = Cred(u.u32(), u.opaque())
        ast = u.u32()
        r = Reply(xid, True, msg, accept_stat=ast, verf=verf)
        if ast == PROG_MISMATCH:
            r.mismatch = (u.u32(), u.u32())
        elif ast == SUCCESS:
            r.results = u.rest()
        return r
    if stat == MSG_DENIED:
        rst = u.u32()
        r = Reply(xid, False, msg, reject_stat=rst)
        if rst == RPC_MISMATCH:
            r.mismatch = (u.u32(), u.u32())
        elif rst == AUTH_ERROR:
            r.auth_stat = u.u32()
        return r
    raise ValueError(f"bad reply_stat {stat}")


# ---------------------------------------------------------------- transport

def _bind_privileged(sock: socket.socket, addr: str) -> None:
    ports = list(range(600, 1024))
    random.shuffle(ports)
    for p in ports:
        try:
            sock.bind((addr, p))
            return
        except OSError:
            continue
    raise OSError("no free privileged port (are we root?)")


_xids = itertools.count(random.randrange(1, 1 << 30))


class RpcClient:
    """One TCP connection or one UDP socket to ``host:port``."""

    def __init__(self, host: str, port: int, proto: str = "tcp", src_addr: str | None = None,
                 src_port=None, cred: Cred = AUTH_NONE_CRED, timeout: float = 10.0):
        """``host`` and ``src_addr`` are IPv4 or IPv6 addresses; ``src_addr`` defaults to
        the loopback address of ``host``'s family."""
        self.host, self.port, self.proto = host, port, proto
        self.cred = cred
        self.timeout = timeout
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        v6 = ":" in host
        if src_addr is None:
            src_addr = "::1" if v6 else "127.0.0.1"
        s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            if src_port == "privileged":
                _bind_privileged(s, src_addr)
            elif src_port is not None or src_addr:
                s.bind((src_addr or "0.0.0.0", int(src_port or 0)))
            s.settimeout(timeout)
            if proto == "tcp":
                s.connect((host, port))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            s.close()
            raise
        self.sock = s
        self._buf = b""

    @property
    def local_addr(self):
        return self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def next_xid() -> int:
        return next(_xids) & 0xFFFFFFFF

    # -- raw bytes ------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        """TCP: bytes as given (include record marks yourself, see frame()).
        UDP: one datagram."""
        if self.proto == "tcp":
            self.sock.sendall(data)
        else:
            self.sock.sendto(data, (self.host, self.port))

    def send_msg(self, msg: bytes, fragments: int = 1) -> None:
        """Send one RPC message (framed on TCP)."""
        self.send_raw(frame(msg, fragments) if self.proto == "tcp" else msg)

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._buf += chunk
        b, self._buf = self._buf[:n], self._buf[n:]
        return b

    def recv_msg(self, timeout: Optional[float] = None) -> bytes:
        """The next whole reply message (fragments joined; no record marks)."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        if self.proto == "udp":
            return self.sock.recvfrom(1 << 17)[0]
        parts = []
        while True:
            hdr = struct.unpack(">I", self._read_exact(4))[0]
            parts.append(self._read_exact(hdr & 0x7FFFFFFF))
            if hdr & 0x80000000:
                return b"".join(parts)

    def recv_reply(self, timeout: Optional[float] = None) -> Reply:
        return parse_reply(self.recv_msg(timeout))

    # -- calls ----------------------------------------------------------
    def build(self, prog: int, vers: int, proc: int, args: bytes = b"", xid: Optional[int] = None,
              cred: Optional[Cred] = None, **kw) -> tuple[int, bytes]:
        """(xid, message bytes) for a call; nothing is sent."""
        xid = self.next_xid() if xid is None else xid
        return xid, build_call(xid, prog, vers, proc, args, cred=self.cred if cred is None else cred, **kw)

    def call(self, prog: int, vers: int, proc: int, args: bytes = b"", xid: Optional[int] = None,
             cred: Optional[Cred] = None, fragments: int = 1, **kw) -> Reply:
        """Send a call and wait for the reply with its XID (others are skipped)."""
        xid, msg = self.build(prog, vers, proc, args, xid=xid, cred=cred, **kw)
        self.send_msg(msg, fragments)
        return self.wait_xid(xid)

    def call_raw(self, msg: bytes, xid: int, fragments: int = 1) -> Reply:
        self.send_msg(msg, fragments)
        return self.wait_xid(xid)

    def wait_xid(self, xid: int, timeout: Optional[float] = None) -> Reply:
        while True:
            r = self.recv_reply(timeout)
            if r.xid == xid:
                return r

    def resend(self, msg: bytes, xid: int) -> Reply:
        """Send a call built with build() (again, for a retransmit) and wait for its reply."""
        self.send_msg(msg)
        return self.wait_xid(xid)


# ---------------------------------------------------------------- NFSv3 XDR

@dataclass
class Fattr:
    type: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    used: int
    rdev: tuple
    fsid: int
    fileid: int
    atime: tuple
    mtime: tuple
    ctime: tuple


def _fattr(u: Unpacker) -> Fattr:
    t, mode, nlink, uid, gid = (u.u32() for _ in range(5))
    size, used = u.u64(), u.u64()
    rdev = (u.u32(), u.u32())
    fsid, fileid = u.u64(), u.u64()
    times = [(u.u32(), u.u32()) for _ in range(3)]
    return Fattr(t, mode, nlink, uid, gid, size, used, rdev, fsid, fileid, *times)


def _post_op_attr(u: Unpacker) -> Optional[Fattr]:
    return _fattr(u) if u.bool() else None


def _pre_op_attr(u: Unpacker):
    if u.bool():
        return {"size": u.u64(), "mtime": (u.u32(), u.u32()), "ctime": (u.u32(), u.u32())}
    return None


def _wcc(u: Unpacker):
    return _pre_op_attr(u), _post_op_attr(u)


def _post_op_fh(u: Unpacker) -> Optional[bytes]:
    return u.opaque() if u.bool() else None


class nfs3_args:
    """Argument encoders (bytes) for NFSv3 and MOUNT v3 procedures."""

    @staticmethod
    def sattr(mode=None, uid=None, gid=None, size=None, atime=None, mtime=None) -> bytes:
        """``atime``/``mtime``: None (DONT_CHANGE), "server" (SET_TO_SERVER_TIME) or
        (seconds, nanoseconds) (SET_TO_CLIENT_TIME)."""
        p = Packer()
        for v in (mode, uid, gid):
            p.bool(v is not None)
            if v is not None:
                p.u32(v)
        p.bool(size is not None)
        if size is not None:
            p.u64(size)
        for t in (atime, mtime):
            if t is None:
                p.u32(0)
            elif t == "server":
                p.u32(1)
            else:
                p.u32(2).u32(t[0]).u32(t[1])
        return p.bytes()

    @staticmethod
    def fh(fh: bytes) -> bytes:
        return Packer().opaque(fh).bytes()

    @staticmethod
    def diropargs(dirfh: bytes, name) -> bytes:
        return Packer().opaque(dirfh).string(name).bytes()

    @staticmethod
    def mnt(path) -> bytes:
        return Packer().string(path).bytes()

    @staticmethod
    def create(dirfh, name, how="unchecked", mode=0o644, verf: bytes = b"\0" * 8, **attrs) -> bytes:
        h = _CREATEMODE[how] if isinstance(how, str) else how
        p = Packer().raw(nfs3_args.diropargs(dirfh, name)).u32(h)
        if h == EXCLUSIVE:
            assert len(verf) == 8
            p.fixed(verf)
        else:
            p.raw(nfs3_args.sattr(mode=mode, **attrs))
        return p.bytes()

    @staticmethod
    def mkdir(dirfh, name, mode=0o755) -> bytes:
        return nfs3_args.diropargs(dirfh, name) + nfs3_args.sattr(mode=mode)

    @staticmethod
    def symlink(dirfh, name, target) -> bytes:
        return (nfs3_args.diropargs(dirfh, name) + nfs3_args.sattr(mode=0o777)
                + Packer().string(target).bytes())

    @staticmethod
    def mknod_fifo(dirfh, name, mode=0o644) -> bytes:
        return nfs3_args.diropargs(dirfh, name) + Packer().u32(NF3FIFO).bytes() + nfs3_args.sattr(mode=mode)

    @staticmethod
    def mknod(dirfh, name, ftype, mode=0o644, rdev=(0, 0)) -> bytes:
        """MKNOD of any ftype3: devices (NF3CHR/NF3BLK) carry sattr3 + specdata3,
        sockets and FIFOs sattr3 only, other types nothing (the server says BADTYPE)."""
        p = Packer().raw(nfs3_args.diropargs(dirfh, name)).u32(ftype)
        if ftype in (NF3CHR, NF3BLK):
            p.raw(nfs3_args.sattr(mode=mode)).u32(rdev[0]).u32(rdev[1])
        elif ftype in (NF3SOCK, NF3FIFO):
            p.raw(nfs3_args.sattr(mode=mode))
        return p.bytes()

    @staticmethod
    def access(fh, mask=ACCESS3_ALL) -> bytes:
        return Packer().opaque(fh).u32(mask).bytes()

    @staticmethod
    def write(fh, offset, data: bytes, stable="file_sync") -> bytes:
        s = _STABLE[stable] if isinstance(stable, str) else stable
        return Packer().opaque(fh).u64(offset).u32(len(data)).u32(s).opaque(data).bytes()

    @staticmethod
    def read(fh, offset, count) -> bytes:
        return Packer().opaque(fh).u64(offset).u32(count).bytes()

    @staticmethod
    def setattr(fh, guard=None, **attrs) -> bytes:
        """``guard``: the ctime (seconds, nanoseconds) the object must still have."""
        p = Packer().opaque(fh).raw(nfs3_args.sattr(**attrs)).bool(guard is not None)
        if guard is not None:
            p.u32(guard[0]).u32(guard[1])
        return p.bytes()

    @staticmethod
    def rename(fromdir, fromname, todir, toname) -> bytes:
        return nfs3_args.diropargs(fromdir, fromname) + nfs3_args.diropargs(todir, toname)

    @staticmethod
    def link(fh, todir, toname) -> bytes:
        return Packer().opaque(fh).bytes() + nfs3_args.diropargs(todir, toname)

    @staticmethod
    def readdir(fh, cookie=0, verf=b"\0" * 8, count=8192) -> bytes:
        return Packer().opaque(fh).u64(cookie).fixed(verf).u32(count).bytes()

    @staticmethod
    def readdirplus(fh, cookie=0, verf=b"\0" * 8, dircount=8192, maxcount=32768) -> bytes:
        return Packer().opaque(fh).u64(cookie).fixed(verf).u32(dircount).u32(maxcount).bytes()

    @staticmethod
    def commit(fh, offset=0, count=0) -> bytes:
        return Packer().opaque(fh).u64(offset).u32(count).bytes()

    @staticmethod
    def namespace_change(dirfh, what: str, n_fh: bytes = b"") -> tuple[int, bytes]:
        """(procedure, arguments) of the namespace change ``what`` in directory
        ``dirfh``, as the retransmission tests send them: "create" (GUARDED) of "new",
        "remove" of "n", "rename" of "n" to "m", "mkdir" of "dir"; with ``n_fh``, the
        handle of "n", also "link" of it as "l"; "rmdir" of "d", "symlink" "s"."""
        return {
            "create": lambda: (NFSPROC3_CREATE, nfs3_args.create(dirfh, "new", "guarded")),
            "remove": lambda: (NFSPROC3_REMOVE, nfs3_args.diropargs(dirfh, "n")),
            "rename": lambda: (NFSPROC3_RENAME, nfs3_args.rename(dirfh, "n", dirfh, "m")),
            "mkdir": lambda: (NFSPROC3_MKDIR, nfs3_args.mkdir(dirfh, "dir")),
            "link": lambda: (NFSPROC3_LINK, nfs3_args.link(n_fh, dirfh, "l")),
            "rmdir": lambda: (NFSPROC3_RMDIR, nfs3_args.diropargs(dirfh, "d")),
            "symlink": lambda: (NFSPROC3_SYMLINK, nfs3_args.symlink(dirfh, "s", "n")),
        }[what]()


@dataclass
class NfsResult:
    """Decoded result of one NFS/MOUNT call: ``status`` plus the key fields the
    procedure returns (``fh``, ``attr``, ``count``, ``committed``, ``verf``,
    ``data``, ``eof``, ``entries``, ``target``, ``dir_attr``...).  ``reply`` is the
    RPC Reply (``reply.raw`` = exact reply bytes)."""
    status: int
    reply: Reply
    fields: dict = field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(f"{name!r} not in this result (status {self.__dict__.get('status')}, "
                                 f"fields {sorted(self.__dict__.get('fields', {}))})") from None

    @property
    def ok(self) -> bool:
        return self.status == 0


def decode_result(proc: int, reply: Reply, mount: bool = False) -> NfsResult:
    """Decode status + key fields of a SUCCESS reply for NFSv3 ``proc`` (or MOUNT MNT)."""
    if not reply.success:
        raise RpcError(f"RPC call not successful: {reply}", reply)
    u = reply.unpacker()
    st = u.u32()
    f: dict = {}
    if mount:
        if st == 0:
            f["fh"] = u.opaque()
            f["flavors"] = [u.u32() for _ in range(u.u32())]
        return NfsResult(st, reply, f)
    ok = st == NFS3_OK
    if proc == NFSPROC3_GETATTR:
        if ok:
            f["attr"] = _fattr(u)
    elif proc == NFSPROC3_LOOKUP:
        if ok:
            f["fh"] = u.opaque()
            f["attr"] = _post_op_attr(u)
        f["dir_attr"] = _post_op_attr(u)
    elif proc in (NFSPROC3_CREATE, NFSPROC3_MKDIR, NFSPROC3_SYMLINK, NFSPROC3_MKNOD):
        if ok:
            f["fh"] = _post_op_fh(u)
            f["attr"] = _post_op_attr(u)
        f["dir_wcc"] = _wcc(u)
    elif proc == NFSPROC3_WRITE:
        f["wcc"] = _wcc(u)
        if ok:
            f["count"], f["committed"], f["verf"] = u.u32(), u.u32(), u.fixed(8)
    elif proc == NFSPROC3_READ:
        f["attr"] = _post_op_attr(u)
        if ok:
            f["count"], f["eof"], f["data"] = u.u32(), u.bool(), u.opaque()
    elif proc in (NFSPROC3_REMOVE, NFSPROC3_RMDIR, NFSPROC3_SETATTR):
        f["wcc"] = _wcc(u)
    elif proc == NFSPROC3_RENAME:
        f["from_wcc"], f["to_wcc"] = _wcc(u), _wcc(u)
    elif proc == NFSPROC3_LINK:
        f["attr"] = _post_op_attr(u)
        f["dir_wcc"] = _wcc(u)
    elif proc in (NFSPROC3_READDIR, NFSPROC3_READDIRPLUS):
        # entries: (fileid, name, cookie), READDIRPLUS's with (..., attr, fh) added
        f["dir_attr"] = _post_op_attr(u)
        if ok:
            f["cookieverf"] = u.fixed(8)
            entries = []
            while u.bool():
                entry = (u.u64(), u.opaque().decode(errors="surrogateescape"), u.u64())
                if proc == NFSPROC3_READDIRPLUS:
                    entry += (_post_op_attr(u), _post_op_fh(u))
                entries.append(entry)
            f["entries"], f["eof"] = entries, u.bool()
    elif proc == NFSPROC3_ACCESS:
        f["attr"] = _post_op_attr(u)
        if ok:
            f["access"] = u.u32()
    elif proc == NFSPROC3_FSSTAT:
        f["attr"] = _post_op_attr(u)
        if ok:
            for k in ("tbytes", "fbytes", "abytes", "tfiles", "ffiles", "afiles"):
                f[k] = u.u64()
            f["invarsec"] = u.u32()
    elif proc == NFSPROC3_FSINFO:
        f["attr"] = _post_op_attr(u)
        if ok:
            for k in ("rtmax", "rtpref", "rtmult", "wtmax", "wtpref", "wtmult", "dtpref"):
                f[k] = u.u32()
            f["maxfilesize"] = u.u64()
            f["time_delta"] = (u.u32(), u.u32())
            f["properties"] = u.u32()
    elif proc == NFSPROC3_PATHCONF:
        f["attr"] = _post_op_attr(u)
        if ok:
            f["linkmax"], f["name_max"] = u.u32(), u.u32()
            for k in ("no_trunc", "chown_restricted", "case_insensitive", "case_preserving"):
                f[k] = u.bool()
    elif proc == NFSPROC3_COMMIT:
        f["wcc"] = _wcc(u)
        if ok:
            f["verf"] = u.fixed(8)
    elif proc == NFSPROC3_READLINK:
        f["attr"] = _post_op_attr(u)
        if ok:
            f["target"] = u.opaque().decode(errors="surrogateescape")
    return NfsResult(st, reply, f)


def decode_mountlist(reply: Reply) -> list:
    """MOUNTPROC3_DUMP results: [(hostname, directory), ...]."""
    if not reply.success:
        raise RpcError(f"RPC call not successful: {reply}", reply)
    u, out = reply.unpacker(), []
    while u.bool():
        out.append((u.opaque().decode(errors="surrogateescape"), u.opaque().decode(errors="surrogateescape")))
    return out


def decode_exports(reply: Reply) -> list:
    """MOUNTPROC3_EXPORT results: [(directory, [group, ...]), ...]."""
    if not reply.success:
        raise RpcError(f"RPC call not successful: {reply}", reply)
    u, out = reply.unpacker(), []
    while u.bool():
        d = u.opaque().decode(errors="surrogateescape")
        groups = []
        while u.bool():
            groups.append(u.opaque().decode(errors="surrogateescape"))
        out.append((d, groups))
    return out


def decode_pmaplist(reply: Reply) -> list:
    """PMAPPROC_DUMP (portmap v2) results: [(prog, vers, prot, port), ...]."""
    if not reply.success:
        raise RpcError(f"RPC call not successful: {reply}", reply)
    u, out = reply.unpacker(), []
    while u.bool():
        out.append((u.u32(), u.u32(), u.u32(), u.u32()))
    return out


class Nfs3Client(RpcClient):
    """RpcClient with MOUNT v3 and NFSv3 procedure helpers.  Every helper takes
    optional ``xid=`` and ``cred=`` and returns an :class:`NfsResult`."""

    def nfs(self, proc: int, args: bytes, xid=None, cred=None) -> NfsResult:
        return decode_result(proc, self.call(NFS_PROG, NFS_V3, proc, args, xid=xid, cred=cred))

    def mnt(self, path, xid=None, cred=None) -> NfsResult:
        r = self.call(MOUNT_PROG, MOUNT_V3, MOUNTPROC_MNT, nfs3_args.mnt(path), xid=xid, cred=cred)
        return decode_result(MOUNTPROC_MNT, r, mount=True)

    def root(self, path) -> bytes:
        """MNT ``path`` and return the handle (raises if refused)."""
        r = self.mnt(path)
        if r.status != MNT3_OK:
            raise RpcError(f"MNT {path!r} refused: mountstat3 {r.status}", r.reply)
        return r.fh

    def getattr(self, fh, **kw):
        return self.nfs(NFSPROC3_GETATTR, nfs3_args.fh(fh), **kw)

    def lookup(self, dirfh, name, **kw):
        return self.nfs(NFSPROC3_LOOKUP, nfs3_args.diropargs(dirfh, name), **kw)

    def readlink(self, fh, **kw):
        return self.nfs(NFSPROC3_READLINK, nfs3_args.fh(fh), **kw)

    def read(self, fh, offset=0, count=65536, **kw):
        return self.nfs(NFSPROC3_READ, nfs3_args.read(fh, offset, count), **kw)

    def write(self, fh, offset, data, stable="file_sync", **kw):
        return self.nfs(NFSPROC3_WRITE, nfs3_args.write(fh, offset, data, stable), **kw)

    def create(self, dirfh, name, how="unchecked", mode=0o644, verf=b"\0" * 8, xid=None, cred=None):
        return self.nfs(NFSPROC3_CREATE, nfs3_args.create(dirfh, name, how, mode, verf), xid=xid, cred=cred)

    def mkdir(self, dirfh, name, mode=0o755, **kw):
        return self.nfs(NFSPROC3_MKDIR, nfs3_args.mkdir(dirfh, name, mode), **kw)

    def symlink(self, dirfh, name, target, **kw):
        return self.nfs(NFSPROC3_SYMLINK, nfs3_args.symlink(dirfh, name, target), **kw)

    def mknod_fifo(self, dirfh, name, **kw):
        return self.nfs(NFSPROC3_MKNOD, nfs3_args.mknod_fifo(dirfh, name), **kw)

    def remove(self, dirfh, name, **kw):
        return self.nfs(NFSPROC3_REMOVE, nfs3_args.diropargs(dirfh, name), **kw)

    def rmdir(self, dirfh, name, **kw):
        return self.nfs(NFSPROC3_RMDIR, nfs3_args.diropargs(dirfh, name), **kw)

    def rename(self, fromdir, fromname, todir, toname, **kw):
        return self.nfs(NFSPROC3_RENAME, nfs3_args.rename(fromdir, fromname, todir, toname), **kw)

    def link(self, fh, todir, toname, **kw):
        return self.nfs(NFSPROC3_LINK, nfs3_args.link(fh, todir, toname), **kw)

    def readdirplus(self, fh, cookie=0, verf=b"\0" * 8, dircount=8192, maxcount=32768, **kw):
        return self.nfs(NFSPROC3_READDIRPLUS, nfs3_args.readdirplus(fh, cookie, verf, dircount, maxcount), **kw)

    def readdir(self, fh, cookie=0, verf=b"\0" * 8, count=8192, **kw):
        return self.nfs(NFSPROC3_READDIR, nfs3_args.readdir(fh, cookie, verf, count), **kw)

    def readdir_all(self, fh, count=32768) -> list:
        """Every (fileid, name, cookie) of a directory, following cookies."""
        out, cookie, verf = [], 0, b"\0" * 8
        while True:
            r = self.readdir(fh, cookie, verf, count)
            if not r.ok:
                raise RpcError(f"READDIR failed: nfsstat3 {r.status}", r.reply)
            out += r.entries
            if r.eof or not r.entries:
                return out
            cookie, verf = r.entries[-1][2], r.cookieverf

    def setattr(self, fh, xid=None, cred=None, **attrs):
        return self.nfs(NFSPROC3_SETATTR, nfs3_args.setattr(fh, **attrs), xid=xid, cred=cred)

    def commit(self, fh, offset=0, count=0, **kw):
        return self.nfs(NFSPROC3_COMMIT, nfs3_args.commit(fh, offset, count), **kw)

    def access(self, fh, mask=ACCESS3_ALL, **kw):
        return self.nfs(NFSPROC3_ACCESS, nfs3_args.access(fh, mask), **kw)

    def mknod(self, dirfh, name, ftype, mode=0o644, rdev=(0, 0), **kw):
        return self.nfs(NFSPROC3_MKNOD, nfs3_args.mknod(dirfh, name, ftype, mode, rdev), **kw)

    def fsstat(self, fh, **kw):
        return self.nfs(NFSPROC3_FSSTAT, nfs3_args.fh(fh), **kw)

    def fsinfo(self, fh, **kw):
        return self.nfs(NFSPROC3_FSINFO, nfs3_args.fh(fh), **kw)

    def pathconf(self, fh, **kw):
        return self.nfs(NFSPROC3_PATHCONF, nfs3_args.fh(fh), **kw)

    # -- MOUNT v3 besides MNT -------------------------------------------
    def mount_dump(self) -> list:
        """MOUNTPROC3_DUMP: [(hostname, directory), ...]."""
        return decode_mountlist(self.call(MOUNT_PROG, MOUNT_V3, MOUNTPROC_DUMP))

    def umnt(self, path) -> Reply:
        return self.call(MOUNT_PROG, MOUNT_V3, MOUNTPROC_UMNT, nfs3_args.mnt(path))

    def umntall(self) -> Reply:
        return self.call(MOUNT_PROG, MOUNT_V3, MOUNTPROC_UMNTALL)

    def mount_export(self) -> list:
        """MOUNTPROC3_EXPORT: [(directory, [group, ...]), ...]."""
        return decode_exports(self.call(MOUNT_PROG, MOUNT_V3, MOUNTPROC_EXPORT))
