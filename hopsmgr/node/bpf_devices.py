"""The GPU fence on cgroup v2: an eBPF device program that denies an attempt's cgroup some char devices.

cgroup v2 has no devices.deny file: the kernel asks the BPF_PROG_TYPE_CGROUP_DEVICE programs attached
to a process's cgroup, and to its ancestors, whether it may open (or mknod) a device, and refuses with
EPERM when one says no. The privileged step (hopsmgr.node.cgroup.create) attaches one such program to
the attempt's unified directory, which answers "deny" for `c <major>:<minor>` in its list and "allow"
for every other device: it only narrows what the parents' programs allow.

The program is a handful of instructions assembled here from the kernel's instruction format
(Documentation/bpf/standardization/instruction-set.rst), loaded and attached with the raw bpf(2)
system call through ctypes (x86_64 and aarch64 only: other architectures are refused with the reason).
It is attached with BPF_F_ALLOW_MULTI, so that it runs beside the programs systemd or a container
runtime attached above (a device is reachable only if every program on the path allows it). An
ancestor whose program was attached without BPF_F_ALLOW_MULTI is refused before attaching: with
BPF_F_ALLOW_OVERRIDE ours would replace its rules for the job, without it the kernel refuses anyway.
Once attached, the program lives as long as the cgroup: its file descriptor is closed at once.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import os
import platform
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

# bpf(2): syscall numbers, commands, the program and attach types, the attach flags (uapi/linux/bpf.h)
SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_QUERY = 5, 8, 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE, BPF_F_ALLOW_MULTI = 1, 2
BPF_DEVCG_DEV_CHAR = 2
LOG_SIZE = 1 << 16

# instruction codes: class | size/operation | mode/source
LDX_MEM_W = 0x01 | 0x00 | 0x60  # BPF_LDX | BPF_W | BPF_MEM: dst = *(u32 *)(src + off)
ALU32_AND_K = 0x04 | 0x50 | 0x00  # BPF_ALU | BPF_AND | BPF_K: dst = (u32)dst & imm
ALU64_MOV_K = 0x07 | 0xB0 | 0x00  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K: if dst == imm, skip `off` instructions
JNE_K = 0x05 | 0x50 | 0x00  # BPF_JMP | BPF_JNE | BPF_K
EXIT = 0x05 | 0x90  # BPF_JMP | BPF_EXIT: return r0
R0, R1, R2 = 0, 1, 2
# struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }, its address in r1
ACCESS_TYPE, MAJOR, MINOR = 0, 4, 8


class BpfError(RuntimeError):
    """The program cannot be loaded or attached (the message says why; `errno` is the kernel's)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One `struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; }`, little-endian
    (both architectures this runs on are): dst_reg is the low nibble of the second byte."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def deny_program(major: int, minors: Iterable[int]) -> bytes:
    """The instructions of a program that returns 0 (deny) for char devices `major`:m, m in `minors`,
    whatever the access, and 1 (allow) for every other device."""
    denied = sorted(set(minors))
    first_compare = 6
    allow = first_compare + len(denied)  # index of `r0 = 1; exit`, followed by `r0 = 0; exit`
    deny = allow + 2
    # a jump's offset counts from the instruction after it
    program = [
        insn(LDX_MEM_W, R2, R1, ACCESS_TYPE),
        insn(ALU32_AND_K, R2, imm=0xFFFF),  # the device type; the access is in the high 16 bits
        insn(JNE_K, R2, off=allow - 3, imm=BPF_DEVCG_DEV_CHAR),
        insn(LDX_MEM_W, R2, R1, MAJOR),
        insn(JNE_K, R2, off=allow - 5, imm=major),
        insn(LDX_MEM_W, R2, R1, MINOR),
        *(insn(JEQ_K, R2, off=deny - (first_compare + k) - 1, imm=m) for k, m in enumerate(denied)),
        insn(ALU64_MOV_K, R0, imm=1),
        insn(EXIT),
        insn(ALU64_MOV_K, R0, imm=0),
        insn(EXIT),
    ]
    return b"".join(program)


class _ProgLoad(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
    ]


class _ProgAttach(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
    ]


class _ProgQuery(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(command: int, attr: ctypes.Structure) -> int:
    """bpf(command, &attr, sizeof attr); its result, or OSError with the kernel's errno."""
    machine = platform.machine()
    number = SYSCALL_NUMBERS.get(machine)
    if number is None:
        raise BpfError(
            f"the bpf(2) system call is not wired for this architecture ({machine}; only "
            f"{' and '.join(SYSCALL_NUMBERS)}): cgroup v2 device rules cannot be set here",
            errnos.ENOSYS,
        )
    size = ctypes.c_ulong(ctypes.sizeof(attr))
    result = int(_libc.syscall(ctypes.c_long(number), ctypes.c_long(command), ctypes.byref(attr), size))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def load(program: bytes, name: str = "hopsmgr_devices") -> int:
    """Load `program` as a cgroup device program; its file descriptor. BpfError with the verifier's
    log when the kernel refuses it."""
    code = ctypes.create_string_buffer(program, len(program))
    license = ctypes.create_string_buffer(b"GPL")
    attr = _ProgLoad(
        prog_type=BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=len(program) // 8,
        insns=ctypes.addressof(code),
        license=ctypes.addressof(license),
        prog_name=name.encode()[:15],
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        first = exc
    # again with the verifier's log (not asked for the first time: a log too long for its buffer
    # would fail a load that is fine)
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ctypes.addressof(log)
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError:
        # on one line: a refusal's reason is read back as its first line
        text = " | ".join(log.value.decode(errors="replace").strip().splitlines())
        detail = f"; the verifier said: {text[-1500:]}" if text else ""
        raise BpfError(f"bpf(BPF_PROG_LOAD) refused: {first.strerror}{detail}", first.errno) from None


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise BpfError(f"cannot open the cgroup {path}: {exc.strerror or exc}", exc.errno) from None


def attached(cgroup_dir: Path) -> tuple[int, int]:
    """How many device programs are attached to this cgroup itself, and the flags they were attached
    with (0 when none)."""
    fd = _open_dir(cgroup_dir)
    try:
        attr = _ProgQuery(target_fd=fd, attach_type=BPF_CGROUP_DEVICE)
        _bpf(BPF_PROG_QUERY, attr)
    except OSError as exc:
        raise BpfError(f"bpf(BPF_PROG_QUERY) on {cgroup_dir}: {exc.strerror}", exc.errno) from None
    finally:
        os.close(fd)
    return int(attr.prog_cnt), int(attr.attach_flags)


def attach(cgroup_dir: Path, prog_fd: int, flags: int = BPF_F_ALLOW_MULTI) -> None:
    """Attach a loaded device program to a cgroup v2 directory."""
    fd = _open_dir(cgroup_dir)
    try:
        attr = _ProgAttach(
            target_fd=fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE, attach_flags=flags
        )
        _bpf(BPF_PROG_ATTACH, attr)
    except OSError as exc:
        raise BpfError(f"bpf(BPF_PROG_ATTACH) to {cgroup_dir}: {exc.strerror}", exc.errno) from None
    finally:
        os.close(fd)


def _ancestors(cgroup_dir: Path) -> list[Path]:
    """The cgroup's parents, up to the root of the cgroup2 mount it is in (the same filesystem)."""
    found: list[Path] = []
    here = cgroup_dir
    try:
        device = cgroup_dir.stat().st_dev
        while here.parent != here and here.parent.stat().st_dev == device:
            here = here.parent
            found.append(here)
    except OSError as exc:
        raise BpfError(f"cannot read the cgroup {here}: {exc.strerror or exc}", exc.errno) from None
    return found


def check_ancestors(cgroup_dir: Path) -> None:
    """BpfError when a parent's device program was attached without BPF_F_ALLOW_MULTI: below it, a
    program of ours would replace its rules (BPF_F_ALLOW_OVERRIDE) or be refused (no flag)."""
    for parent in _ancestors(cgroup_dir):
        count, flags = attached(parent)
        if count and not flags & BPF_F_ALLOW_MULTI:
            effect = (
                "a program attached below it would replace its device rules for the job"
                if flags & BPF_F_ALLOW_OVERRIDE
                else "it allows no device program below it"
            )
            raise BpfError(
                f"the cgroup {parent} has a device program attached without BPF_F_ALLOW_MULTI: {effect}",
                errnos.EPERM,
            )


def fence(cgroup_dir: Path, deny: Sequence[tuple[int, int]]) -> None:
    """Deny the processes of `cgroup_dir` (a cgroup v2 directory) the char devices `deny` (major,
    minor): one program per major, attached beside whatever the cgroup's parents run."""
    by_major: dict[int, list[int]] = {}
    for major, minor in deny:
        by_major.setdefault(major, []).append(minor)
    if not by_major:
        return
    check_ancestors(cgroup_dir)
    for major, minors in sorted(by_major.items()):
        prog_fd = load(deny_program(major, minors))
        try:
            attach(cgroup_dir, prog_fd)
        finally:
            os.close(prog_fd)  # the cgroup holds the program from here on
