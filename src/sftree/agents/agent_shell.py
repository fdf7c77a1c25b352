"""The shell OpenCode's bash tool starts in an edge's sandbox (`SHELL`): bash under a seccomp filter that keeps
every command of the agent off the network stack, so none reaches OpenCode's own server (it listens on the
sandbox's loopback, where the driver's bridge to the proxy listens too) and nothing can take that server's memory
or descriptors. Runs in the sandbox as `python -I`, standard library only, no sftree import:

    agent_shell.py [bash arguments...]      (the host writes it with BASH set, as an executable script)

What the filter refuses (EACCES), for the process and all it starts (a filter cannot be removed):
- `socket()` for AF_INET and AF_INET6 (the sandbox has no network; the `coral` client speaks over a Unix socket,
  which stays allowed);
- `io_uring_setup` (its rings can open and connect sockets without the `socket` call);
- `ptrace`, `process_vm_readv`/`writev` and `pidfd_getfd` (another process's memory or descriptors: the server
  and the driver run as the same user);
- any system call of another ABI (i386 or x32 on x86_64), whose numbers this filter does not check.

docs/security.md ("OpenCode's server") says why this is the agent's shell and not a password: OpenCode hands its
own environment to every command, and its server runs as the same user, so no secret of its is out of reach.
"""

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO, EACCES = 0x7FFF0000, 0x00050000, 13
LD_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
AF_INET, AF_INET6 = 2, 10
BASH = "/bin/bash"  # the host writes the real path here (`script`)
# (audit arch, socket, [refused always]): io_uring_setup, ptrace, process_vm_readv, process_vm_writev, pidfd_getfd
ARCHES = {
    "x86_64": (0xC000003E, 41, [425, 101, 310, 311, 438]),
    "aarch64": (0xC00000B7, 198, [425, 117, 270, 271, 438]),
}


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions."""
    arch, sock, refused = ARCHES[machine]
    deny = (RET, 0, 0, RET_ERRNO | EACCES)
    out = [(LD_ABS, 0, 0, 4), (JEQ, 1, 0, arch), deny, (LD_ABS, 0, 0, 0)]
    if machine == "x86_64":
        out += [(JGE, 0, 1, 0x40000000), deny]  # the x32 ABI shares x86_64's audit arch
    for nr in refused:
        out += [(JEQ, 0, 1, nr), deny]
    out += [(JEQ, 1, 0, sock), (RET, 0, 0, RET_ALLOW)]
    out += [(LD_ABS, 0, 0, 16), (JEQ, 2, 0, AF_INET), (JEQ, 1, 0, AF_INET6), (RET, 0, 0, RET_ALLOW), deny]
    return out


def install(machine: str) -> None:
    code = b"".join(struct.pack("HBBI", *ins) for ins in program(machine))
    buf = ctypes.create_string_buffer(code)
    prog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buf))
    pbuf = ctypes.create_string_buffer(prog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4  # a pointer must not be cut to an int
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(pbuf), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(SECCOMP)")


def script(python: str, bash: str) -> str:
    """This module as the executable the host writes for the sandbox, with its interpreter and bash."""
    source = open(__file__, encoding="utf-8").read()  # noqa: SIM115 - read once, here
    return f"#!{python} -I\n" + source.replace('BASH = "/bin/bash"', f"BASH = {bash!r}", 1)


def main(argv: list[str]) -> None:
    try:
        install(platform.machine())
    except (KeyError, OSError) as exc:  # never run the agent's command unfiltered
        sys.stderr.write(f"sftree: the agent's shell could not be confined: {exc}\n")
        sys.exit(126)
    os.execv(BASH, ["bash", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
