"""The cgroup v2 GPU fence (hopsmgr.node.bpf_devices): the instruction encoding and the program's
decisions, checked here without a kernel; then the real thing, as root: the program loaded with bpf(2),
attached to a cgroup2 directory made for the test, and a child moved into that cgroup is refused the
denied device files (EPERM) while it opens the others; a process outside it opens them all.

The device files are real character devices made with mknod (major 195, and /dev/null's 1:3). Opening a
195 device that is allowed gets past the fence and then fails with ENXIO on a host without the NVIDIA
driver (it opens with it): the tests tell the fence's EPERM from that. The kernel tests are skipped,
with the reason, when not root, without a cgroup2 mount, or where bpf(2) is refused (EPERM, ENOSYS).
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hopsmgr.node import bpf_devices as bpf
from hopsmgr.node import cgroup

from .util import bpf_refusal, device_nodes, open_each, open_in_child

CHAR, BLOCK = 2, 1
READ_WRITE = (2 | 4) << 16  # BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE, in access_type's high half


def test_instructions_are_encoded_as_the_kernel_reads_them() -> None:
    # r2 = *(u32 *)(r1 + 4): code 0x61, src 1 in the high nibble and dst 2 in the low one, off 4
    assert bpf.insn(bpf.LDX_MEM_W, bpf.R2, bpf.R1, 4) == bytes.fromhex("6112040000000000")
    assert bpf.insn(bpf.ALU64_MOV_K, bpf.R0, imm=1) == bytes.fromhex("b700000001000000")  # r0 = 1
    assert bpf.insn(bpf.EXIT) == bytes.fromhex("9500000000000000")
    # signed offset and immediate, little-endian: if r2 == -2 goto -1
    assert bpf.insn(bpf.JEQ_K, bpf.R2, off=-1, imm=-2) == bytes.fromhex("1502fffffeffffff")


def run(program: bytes, access_type: int, major: int, minor: int) -> int:
    """The program's answer for one bpf_cgroup_dev_ctx, by a small interpreter of the codes it uses."""
    insns = [struct.unpack("<BBhi", program[i : i + 8]) for i in range(0, len(program), 8)]
    ctx = {bpf.ACCESS_TYPE: access_type, bpf.MAJOR: major, bpf.MINOR: minor}
    regs, pc = {bpf.R1: -1}, 0
    while True:
        code, reg_byte, off, imm = insns[pc]
        dst, src = reg_byte & 0x0F, reg_byte >> 4
        pc += 1
        if code == bpf.LDX_MEM_W:
            assert regs[src] == -1, "loads only from the context"
            regs[dst] = ctx[off]
        elif code == bpf.ALU32_AND_K:
            regs[dst] = regs[dst] & imm & 0xFFFFFFFF
        elif code == bpf.ALU64_MOV_K:
            regs[dst] = imm
        elif code in (bpf.JEQ_K, bpf.JNE_K):
            if (regs[dst] == imm) == (code == bpf.JEQ_K):
                pc += off
        elif code == bpf.EXIT:
            return regs[bpf.R0]
        else:
            raise AssertionError(f"unexpected code {code:#x}")


def test_the_program_denies_the_listed_char_minors_of_its_major_only() -> None:
    program = bpf.deny_program(195, [2, 1, 2])
    assert len(program) == 8 * (6 + 2 + 4)  # the duplicate is compared once
    for kind, major, minor, allowed in (
        (CHAR, 195, 1, 0),
        (CHAR, 195, 2, 0),
        (CHAR, 195, 0, 1),
        (CHAR, 195, 255, 1),  # nvidiactl
        (BLOCK, 195, 1, 1),
        (CHAR, 1, 3, 1),
        (CHAR, 1, 1, 1),
    ):
        for access in (0, READ_WRITE, 1 << 16):
            assert run(program, access | kind, major, minor) == allowed, (kind, major, minor, access)
    every = bpf.deny_program(195, range(254))
    assert [run(every, CHAR | READ_WRITE, 195, m) for m in range(256)] == [0] * 254 + [1, 1]


def test_other_architectures_are_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(bpf.BpfError, match=r"not wired for this architecture \(riscv64") as refused:
        bpf.load(bpf.deny_program(195, [0]))
    assert refused.value.errno == errno.ENOSYS


# --- the kernel, as root ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel() -> None:
    why = bpf_refusal()
    if why:
        pytest.skip(why)


@pytest.fixture
def cgroups(kernel: None) -> Iterator[Path]:
    """A cgroup2 directory of the test's own; it and every directory made under it removed after."""
    unified = cgroup.hierarchies().unified
    assert unified is not None
    top = unified / f"hopsmgr-test-bpf-{os.getpid()}"
    top.mkdir()
    yield top
    deadline = time.monotonic() + 10
    for d in [Path(here) for here, _, _ in os.walk(top, topdown=False)]:
        while d.exists():  # an exited child may stay a member for a moment
            with contextlib.suppress(OSError):
                d.rmdir()
            assert time.monotonic() < deadline, f"cannot remove {d}"
            time.sleep(0.02)


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, str]:
    paths = device_nodes(tmp_path / "dev")
    if open_each({"null": paths["null"]})["null"] != "opened":
        pytest.skip(f"device files cannot be opened under {tmp_path} at all (a nodev mount?)")
    return paths


def into(cgroup_dir: Path) -> Callable[[int], None]:
    """Move a process into the cgroup (the test's child, before it opens anything)."""

    def move(pid: int) -> None:
        (cgroup_dir / "cgroup.procs").write_text(str(pid))

    return move


def test_a_process_in_the_cgroup_cannot_open_the_denied_gpus(cgroups: Path, nodes: dict[str, str]) -> None:
    job = cgroups / "job"
    job.mkdir()
    bpf.fence(job, [(195, 1), (195, 2)])
    assert bpf.attached(job) == (1, bpf.BPF_F_ALLOW_MULTI)
    inside = open_in_child(nodes, move=into(job))
    assert inside["nvidia1"] == inside["nvidia2"] == "EPERM", inside
    # past the fence: ENXIO without the NVIDIA driver, opened with it
    assert inside["nvidia0"] in ("ENXIO", "opened") and inside["nvidiactl"] in ("ENXIO", "opened"), inside
    assert inside["null"] == "opened", inside
    outside = open_in_child(nodes)
    assert "EPERM" not in outside.values() and outside["null"] == "opened", outside


def test_the_program_composes_with_a_parents_program(cgroups: Path, nodes: dict[str, str]) -> None:
    """A parent's program attached with BPF_F_ALLOW_MULTI (as systemd attaches its own) still holds
    below ours: a device is reachable only if every program on the path allows it."""
    job = cgroups / "job"
    job.mkdir()
    parent_program = bpf.load(bpf.deny_program(195, [0]))
    try:
        bpf.attach(cgroups, parent_program, bpf.BPF_F_ALLOW_MULTI)
    finally:
        os.close(parent_program)
    bpf.fence(job, [(195, 1)])
    inside = open_in_child(nodes, move=into(job))
    assert [inside[n] == "EPERM" for n in ("nvidia0", "nvidia1", "nvidia2", "null")] == [
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (bpf.BPF_F_ALLOW_OVERRIDE, "would replace its device rules"),
        (0, "allows no device program below it"),
    ],
)
def test_a_parent_program_without_allow_multi_is_refused(
    cgroups: Path, nodes: dict[str, str], flags: int, why: str
) -> None:
    """Below a program attached with BPF_F_ALLOW_OVERRIDE ours would replace it for the job (its rules
    dropped); below one attached with no flag the kernel refuses: both are refused before attaching."""
    job = cgroups / "job"
    job.mkdir()
    parent_program = bpf.load(bpf.deny_program(195, [0]))
    try:
        bpf.attach(cgroups, parent_program, flags)
    finally:
        os.close(parent_program)
    assert bpf.attached(cgroups) == (1, flags)
    with pytest.raises(bpf.BpfError, match=why):
        bpf.fence(job, [(195, 1)])
    assert bpf.attached(job) == (0, 0)
    inside = open_in_child(nodes, move=into(job))
    assert inside["nvidia0"] == "EPERM" and inside["nvidia1"] != "EPERM", inside  # the parent's rule holds


def test_a_program_the_verifier_rejects_reports_its_log(kernel: None) -> None:
    with pytest.raises(bpf.BpfError, match=r"the verifier said: .*exit") as refused:
        bpf.load(bpf.insn(bpf.EXIT))  # returns r0 without setting it
    assert refused.value.errno == errno.EACCES and "\n" not in str(refused.value)
