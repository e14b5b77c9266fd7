"""A seccomp filter that keeps sandboxed commands from creating user namespaces.

Inside a user namespace of its own a process holds every capability over it (mounts,
netfilter, ...), which is the way into most kernel bugs; nothing a repository's build or
tests needs. bwrap's ``--disable-userns`` would do it, but at the price of a nested
namespace whose ``/proc/self/uid_map`` reads ``1000 0 1`` (0 being the intermediate
namespace's root, not the host's), so the sandbox keeps one user namespace and this
filter instead: ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with EPERM,
``clone3`` (whose flags a filter cannot read) with ENOSYS, on which the C library falls
back to ``clone``. System calls of another ABI than the host's (x32, i386) fail with
ENOSYS, so they cannot go around the filter.

The program is classic BPF as bwrap's ``--seccomp FD`` reads it (``struct sock_filter``
in host byte order).
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h, linux/sched.h
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16

# machine -> (audit arch, unshare, clone, clone3, whether x32 numbers exist)
ARCHITECTURES = {
    "x86_64": (0xC000003E, 272, 56, 435, True),
    "aarch64": (0xC00000B7, 97, 220, 435, False),
}


Instruction = tuple[int, str | int, str | int, int]


def _assemble(program: list[Instruction], labels: dict[str, int]) -> bytes:
    """Instructions whose jump targets are labels (or 0: the next one), packed."""
    packed = b""
    for index, (code, true, false, k) in enumerate(program):
        jt = labels[true] - index - 1 if isinstance(true, str) else true
        jf = labels[false] - index - 1 if isinstance(false, str) else false
        packed += struct.pack("=HBBI", code, jt, jf, k)
    return packed


@functools.cache
def no_user_namespaces_filter(machine: str | None = None) -> bytes | None:
    """The filter for this host's architecture; None where none is known."""
    known = ARCHITECTURES.get(machine or platform.machine())
    if known is None:
        return None
    arch, unshare, clone, clone3, x32 = known
    program: list[Instruction] = [
        (LD_W_ABS, 0, 0, OFFSET_ARCH),
        (JEQ_K, 0, "enosys", arch),
        (LD_W_ABS, 0, 0, OFFSET_NR),
        (JGE_K, "enosys", 0, X32_SYSCALL_BIT) if x32 else (JEQ_K, "enosys", 0, 0xFFFFFFFF),
        (JEQ_K, "enosys", 0, clone3),
        (JEQ_K, "flags", 0, unshare),
        (JEQ_K, "flags", "allow", clone),
        (LD_W_ABS, 0, 0, OFFSET_ARG0),  # flags: the low word of the first argument
        (JSET_K, "eperm", "allow", CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ALLOW),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]
    labels = {"flags": 7, "allow": 9, "eperm": 10, "enosys": 11}
    return _assemble(program, labels)
