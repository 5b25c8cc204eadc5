"""An isolated attempt's cgroups: `--mem` and `--cpus` hold, and the node's GPUs it was not granted
cannot be opened, on this host's own hierarchies (cgroup v2 where it offers a controller, v1 where not).

The first tests read mount tables and driver listings written here. The others start real jobs as a
real Unix account through the wrapper and the privileged step, as root (the step's own rule; CI runs
as root): a job that allocates past its memory limit is killed, a busy job under `--cpus 0.2` gets
about a fifth of a CPU, and a job granted GPU 0 of three is refused the other two GPUs' device files.
The GPU device files are real character devices (major 195, made with mknod): the devices controller
refuses a denied one with EPERM, while opening an allowed one gets past it (ENXIO on a host without
the NVIDIA driver, success with it). The GPU fence is the v1 devices hierarchy where one is mounted,
else a cgroup v2 eBPF device program; the v2 path is also run through `create` and `enter` on any host
with a cgroup2 mount, by handing them hierarchies without a v1 devices one. Each is skipped, with the
reason, on a host whose hierarchies lack the controller (or that refuses bpf(2), for the v2 fence).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import time
from pathlib import Path

import pytest

from hopsmgr.node import bpf_devices, cgroup, gpu_devices, ops, runas

from .conftest import USER
from .util import bpf_refusal, device_nodes, fake_driver, open_each, open_in_child

JOB_PYTHON = "/usr/bin/python3"

HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 {unified} cgroup2 rw,relatime 0 0
"""


def test_hierarchies_are_read_from_the_mount_table(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpu pids\n")
    found = cgroup.hierarchies(HYBRID.format(unified=unified))
    assert found.unified == unified
    assert found.v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "devices": Path("/sys/fs/cgroup/devices"),
    }
    assert (found.home("cpu"), found.home("memory"), found.home("io")) == ("v2", "v1", None)
    cg = cgroup.attempt_cgroup(Path("/w"), "a-000001", found)
    assert cg is not None and cg.unified is not None
    assert cg.unified.parent == unified / "hopsmgr" and cg.unified.name.startswith("a-000001-")
    # cpu comes from the unified hierarchy that offers it; memory and devices from their v1 ones
    assert set(cg.v1) == {"memory", "devices"}
    assert cg.v1["memory"] == Path("/sys/fs/cgroup/memory/hopsmgr") / cg.unified.name
    assert cgroup.check_controllers(512, 1.0, found) == {"memory", "cpu"}


def test_a_limit_no_hierarchy_offers_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("pids\n")
    v2_only = cgroup.hierarchies(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    assert v2_only.v1 == {} and v2_only.home("memory") is None
    with pytest.raises(cgroup.CgroupError, match=r"memory controller is not available .*offers: pids"):
        cgroup.check_controllers(512, None, v2_only)
    assert cgroup.check_controllers(None, None, v2_only) == set()
    assert cgroup.attempt_cgroup(Path("/w"), "a-1", cgroup.hierarchies("")) is None


def test_gpu_indices_follow_pci_bus_order_not_minor_numbers(tmp_path: Path) -> None:
    driver = fake_driver(tmp_path, {"0000:86:00.0": 0, "0000:3b:00.0": 2, "0000:5e:00.0": 1})
    gpus = gpu_devices.node_gpus(driver)
    assert gpus is not None and gpus.counted == (2, 1, 0)
    rules = gpu_devices.rules_for({"CUDA_VISIBLE_DEVICES": "2,0"}, driver)
    # index 2 is minor 0 and index 0 minor 2; CUDA, seeing those two alone, counts them 0 (index 0), 1
    assert rules.deny == ((195, 1),) and rules.visible == "1,0" and rules.note == ""
    assert gpu_devices.rules_for({}, tmp_path / "none") == gpu_devices.NO_RULES  # no driver here


def test_a_grant_that_cannot_be_mapped_fences_every_gpu(tmp_path: Path) -> None:
    driver = fake_driver(tmp_path / "d", {"0000:3b:00.0": 0, "0000:5e:00.0": 1})
    every = {(195, m) for m in range(254)}
    for env, why in (
        ({}, "no GPUs were granted"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1234"}, "not indices of this node's 2 GPUs"),
        ({"CUDA_VISIBLE_DEVICES": "2"}, "not indices"),
        ({"CUDA_VISIBLE_DEVICES": "0,0"}, "not indices"),
        ({"CUDA_VISIBLE_DEVICES": "0,00"}, "not indices"),
        ({"CUDA_VISIBLE_DEVICES": "\u00b2"}, "not indices"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "no GPUs were granted"),  # a node of slots, not GPUs
        ({"CUDA_VISIBLE_DEVICES": " "}, "no GPUs were granted"),
    ):
        rules = gpu_devices.rules_for(env, driver)
        assert set(rules.deny) == every and rules.visible == "" and why in rules.note, env
    (driver / "0000:5e:00.0" / "information").write_text("Model: x\n")  # no minor: the order is unknown
    rules = gpu_devices.rules_for({"CUDA_VISIBLE_DEVICES": "0"}, driver)
    assert set(rules.deny) == every and "names no Device Minor" in rules.note
    excluded = fake_driver(tmp_path / "e", {"0000:3b:00.0": 0, "0000:5e:00.0": 1, "0000:86:00.0": 2})
    info = excluded / "0000:5e:00.0" / "information"
    info.write_text(info.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    # NVML does not count an excluded GPU: index 1 is minor 2; the excluded one is fenced off too
    rules = gpu_devices.rules_for({"CUDA_VISIBLE_DEVICES": "1"}, excluded)
    assert rules.deny == ((195, 0), (195, 1)) and rules.visible == "0"


def test_the_policy_names_the_gpu_listing(tmp_path: Path) -> None:
    policy = tmp_path / "runas.toml"
    for text, why in (
        ('nvidia_gpus = "relative"\n', "must be an absolute path"),
        ('min_uid = 1000\ngpus = "/x"\n', "not gpus"),
    ):
        policy.write_text(text)
        os.chmod(policy, 0o644)
        if os.geteuid() != 0:
            pytest.skip("the policy must be root's file")
        with pytest.raises(runas.Refused, match=why):
            runas.load_policy(policy)
    listing = tmp_path / "listing"
    listing.mkdir()
    os.chmod(listing, 0o777)
    policy.write_text(f'nvidia_gpus = "{listing}"\n')
    loaded = runas.load_policy(policy)  # stop and cleanup read the policy too: they must not fail on it
    with pytest.raises(runas.Refused, match="no one else may write"):
        runas._gpu_listing(loaded)  # a job's start does
    os.chmod(listing, 0o755)
    assert runas._gpu_listing(loaded) == listing
    policy.write_text(f'nvidia_gpus = "{listing}/../listing"\n')
    with pytest.raises(runas.Refused, match="plain absolute path"):
        runas.load_policy(policy)


def test_the_job_counts_gpus_in_pci_bus_order(tmp_path: Path) -> None:
    overlay = ops._child_overlay(
        ops.Attempt(tmp_path, "a-000001"), "j-1", "run", 2, tmp_path, "1,3", 20, None, {}
    )
    assert overlay["CUDA_VISIBLE_DEVICES"] == "1,3" and overlay["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# --- real jobs, as root -----------------------------------------------------------------------------
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or not os.access(JOB_PYTHON, os.X_OK),
    reason="needs root, useradd and /usr/bin/python3: it runs jobs as a Unix account it creates",
)


def needs_controller(name: str) -> None:
    if cgroup.hierarchies().home(name) is None:
        pytest.skip(f"this host offers no {name} controller, in cgroup v2 or v1")


def run_job(
    workdir: Path, attempt: str, script: str, timeout: float = 60, **launch: object
) -> dict[str, object]:
    """Launch `script` as the account, wait for it to end; its exit record and log."""
    ops.launch(workdir, attempt, "j-000001", 1, [JOB_PYTHON, "-c", script], run_as=USER, **launch)  # type: ignore[arg-type]
    done = workdir / "attempts" / attempt / "exit.json"
    deadline = time.monotonic() + timeout
    while not done.exists():
        assert time.monotonic() < deadline, f"{attempt} still running after {timeout} s"
        time.sleep(0.1)
    return {**json.loads(done.read_text()), "log": ops.logs(workdir, attempt)["log"]}


ALLOCATE = """
chunks = []
for i in range({mb}):
    chunks.append(bytearray(1 << 20))
    chunks[-1][::4096] = b"x" * len(chunks[-1][::4096])
print("allocated", len(chunks), "MiB", flush=True)
"""


@needs_root
def test_a_job_past_its_memory_limit_is_killed(account: pwd.struct_passwd, node: Path) -> None:
    needs_controller("memory")
    small = run_job(node, "a-000001", ALLOCATE.format(mb=16), mem_mb=64)
    assert small["code"] == 0 and "allocated 16 MiB" in str(small["log"]), small
    big = run_job(node, "a-000002", ALLOCATE.format(mb=400), mem_mb=64)
    assert big["signal"] == 9 and "allocated" not in str(big["log"]), big
    unlimited = run_job(node, "a-000003", ALLOCATE.format(mb=200))
    assert unlimited["code"] == 0 and "allocated 200 MiB" in str(unlimited["log"]), unlimited


SPIN = """
import os, time
start, cpu0 = time.monotonic(), time.process_time()
while time.monotonic() - start < 2.0:
    pass
print("cpu share %.3f" % ((time.process_time() - cpu0) / (time.monotonic() - start)), flush=True)
"""


def cpu_share(log: object) -> float:
    line = next(x for x in str(log).splitlines() if x.startswith("cpu share "))
    return float(line.split()[-1])


@needs_root
def test_a_busy_job_gets_the_cpus_it_asked_for(account: pwd.struct_passwd, node: Path) -> None:
    needs_controller("cpu")
    capped = run_job(node, "a-000001", SPIN, cpus=0.2)
    free = run_job(node, "a-000002", SPIN)
    # a fifth of a CPU, give or take the scheduler's period; without the cap, (nearly) a whole one
    assert cpu_share(capped["log"]) < 0.35, capped
    assert cpu_share(free["log"]) > 2 * cpu_share(capped["log"]), (free, capped)


OPEN_GPUS = """
import errno, os
print("visible", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(path, "opened")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
"""


def opened_as(log: object) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in str(log).splitlines() if line.startswith("/"))


@needs_root
def test_a_job_cannot_open_the_gpus_it_was_not_granted(account: pwd.struct_passwd, node: Path) -> None:
    cg = cgroup.attempt_cgroup(node, "a-000001")
    fence = cgroup.device_fence(cg) if cg is not None else None
    if fence is None:
        pytest.skip("this host has neither a cgroup v1 devices hierarchy nor a cgroup2 one to fence GPUs in")
    if fence == "v2" and (why := bpf_refusal()):
        pytest.skip(f"the GPU fence here is a cgroup v2 device program, and {why}")
    dev = node.parent / "dev"
    dev.mkdir()
    os.chmod(dev, 0o755)
    for minor in (0, 1, 2, 255):
        path = dev / (f"nvidia{minor}" if minor != 255 else "nvidiactl")
        os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))  # S_IFCHR
        os.chmod(path, 0o666)
    paths = [str(dev / name) for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl")]
    try:
        os.close(os.open(paths[0], os.O_RDWR))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            pytest.skip(f"device files cannot be opened here at all ({exc}: a nodev mount?)")
    script = OPEN_GPUS.replace("sys.argv[1:]", repr(paths))
    # GPU index 0 is the first in PCI bus order: 0000:3b:00.0, whose minor is 1
    granted = run_job(node, "a-000001", script, visible_devices="0", gpus=1)
    opened = opened_as(granted["log"])
    assert [opened[p] == "EPERM" for p in paths] == [True, False, True, False], granted  # nvidiactl stays
    assert "visible 0" in str(granted["log"]), granted  # CUDA counts the one GPU it can open as 0
    second = run_job(node, "a-000002", script, visible_devices="2", gpus=1)  # index 2: minor 2
    assert [opened_as(second["log"])[p] == "EPERM" for p in paths] == [True, True, False, False], second
    assert "visible 0" in str(second["log"]), second
    none = run_job(node, "a-000003", script)  # no GPUs granted: every GPU fenced off, and the log says so
    assert [opened_as(none["log"])[p] == "EPERM" for p in paths] == [True, True, True, False], none
    assert "no GPUs were granted" in str(none["log"]), none


@needs_root
def test_on_cgroup_v2_a_device_program_fences_off_the_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cgroup v2 fence through create and enter, forced on any host with a cgroup2 mount by
    hierarchies without a v1 devices one (as a pure-v2 host has): a process that entered the attempt's
    cgroup is refused the GPUs denied (EPERM) and opens the others, nvidiactl and /dev/null's numbers;
    a fence that cannot be set up (a parent's device program attached without BPF_F_ALLOW_MULTI)
    refuses the attempt and removes what was made."""
    if why := bpf_refusal():
        pytest.skip(why)
    unified = cgroup.hierarchies().unified
    assert unified is not None
    v2 = cgroup.Hierarchies(unified, {})
    monkeypatch.setattr(cgroup, "PARENT", f"hopsmgr-test-{os.getpid()}")
    cg = cgroup.attempt_cgroup(tmp_path, "a-000001", v2)
    assert cg is not None and cg.unified is not None and cgroup.device_fence(cg) == "v2"
    nodes = device_nodes(tmp_path / "dev")
    if open_each({"null": nodes["null"]})["null"] != "opened":
        pytest.skip(f"device files cannot be opened under {tmp_path} at all (a nodev mount?)")
    parent = cg.unified.parent
    try:
        made = cgroup.create(cg, None, None, [(195, 0), (195, 2)], v2)
        assert made.dirs == (cg.unified,) and bpf_devices.attached(cg.unified)[0] == 1

        def enter() -> None:
            cgroup.enter(made)

        inside = open_in_child(nodes, enter=enter)
        names = ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "null")
        assert [inside[n] == "EPERM" for n in names] == [True, False, True, False, False], inside
        assert inside["null"] == "opened", inside
        assert cgroup.kill_and_remove(cg)
        blocking = bpf_devices.load(bpf_devices.deny_program(195, [253]))
        try:
            bpf_devices.attach(parent, blocking, 0)
        finally:
            os.close(blocking)
        with pytest.raises(cgroup.CgroupError, match=r"device program .* without BPF_F_ALLOW_MULTI"):
            cgroup.create(cg, None, None, [(195, 1)], v2)
        assert not cg.exists()
    finally:
        cgroup.kill_and_remove(cg)
        with contextlib.suppress(OSError):
            parent.rmdir()


@needs_root
def test_a_fence_that_would_not_hold_is_refused_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under a devices parent that denies by default and allows c 195:* (GPU passthrough setups), a
    deny rule would be accepted and change nothing: create refuses, and removes what it made."""
    found = cgroup.hierarchies()
    if found.home("devices") != "v1" or found.home("memory") is None:
        pytest.skip("needs a cgroup v1 devices hierarchy and a memory controller")
    monkeypatch.setattr(cgroup, "PARENT", f"hopsmgr-test-{os.getpid()}")
    cg = cgroup.attempt_cgroup(tmp_path, "a-000001", found)
    assert cg is not None
    parent = cg.v1["devices"].parent
    parent.mkdir()
    try:
        (parent / "devices.deny").write_text("a")
        (parent / "devices.allow").write_text("c 195:* rwm")
        with pytest.raises(cgroup.CgroupError, match="does not allow by default"):
            cgroup.create(cg, 64, None, [(195, 1)], found)
        assert not cg.exists()  # the attempt's own directories are gone (the shared parents stay)
        # a cgroup removed between create and enter (a stop meanwhile): enter fails (in a child, so
        # that a regression could not move this test process into a cgroup)
        made = cgroup.create(cg, 64, None, (), found)
        assert cgroup.kill_and_remove(cg)
        pid = os.fork()
        if pid == 0:
            try:
                cgroup.enter(made)
                os._exit(0)
            except cgroup.CgroupError as exc:
                os._exit(3 if "cannot move into" in str(exc) else 4)
            except BaseException:
                os._exit(5)
        assert os.waitpid(pid, 0)[1] >> 8 == 3
    finally:
        for d in [*cg.dirs(), *{d.parent for d in cg.dirs()}]:
            with contextlib.suppress(OSError):
                d.rmdir()


def test_the_step_refuses_a_job_it_cannot_fence_or_keep_in_its_cgroup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """runas._enter_cgroups' decisions, with the cgroup calls faked (the real ones are tested above):
    refuse when the fence or the entry fails; run without a cgroup, saying so, only when nothing
    needed one; on a host that cannot fence, ask CUDA to show no GPUs to a job granted none."""
    driver = fake_driver(tmp_path / "driver", {"0000:3b:00.0": 0, "0000:5e:00.0": 1})
    verified = runas.Verified(
        ops.Attempt(tmp_path / "w", "a-000001"), {}, pwd.getpwuid(os.getuid()), os.getgid(),
        runas.Policy(nvidia_gpus=str(driver)),
    )  # fmt: skip
    fenced = cgroup.Hierarchies(tmp_path / "unified", {"devices": tmp_path / "devices"})
    fenced_v2 = cgroup.Hierarchies(tmp_path / "unified", {})  # a device program on the unified directory
    unfenced = cgroup.Hierarchies(None, {"memory": tmp_path / "memory"})  # v1 only, no devices hierarchy
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)

    def fail(*args: object, **kw: object) -> None:
        raise cgroup.CgroupError("refused by the kernel")

    def start(where: cgroup.Hierarchies, env: dict[str, str]) -> dict[str, str]:
        monkeypatch.setattr(cgroup, "hierarchies", lambda: where)
        runas._enter_cgroups(verified, log, env)
        return env

    monkeypatch.setattr(cgroup, "create", fail)
    with pytest.raises(runas.Refused, match="refused by the kernel"):
        start(fenced, {"CUDA_VISIBLE_DEVICES": "1"})  # the fence is needed and cannot be set up
    with pytest.raises(runas.Refused, match="refused by the kernel"):
        start(fenced_v2, {"CUDA_VISIBLE_DEVICES": "1"})  # on cgroup v2 as well
    env = start(unfenced, {})  # nothing needs a cgroup: it runs, its log says how it runs
    assert env == {"CUDA_VISIBLE_DEVICES": ""}
    made = cgroup.Made((tmp_path / "gone",))
    monkeypatch.setattr(cgroup, "create", lambda *a, **k: made)
    monkeypatch.setattr(cgroup, "enter", fail)
    with pytest.raises(runas.Refused):
        start(unfenced, {"CUDA_VISIBLE_DEVICES": "0"})  # removed by a stop between create and enter
    monkeypatch.setattr(cgroup, "enter", lambda m: None)
    assert start(fenced, {"CUDA_VISIBLE_DEVICES": "1"}) == {"CUDA_VISIBLE_DEVICES": "0"}
    denied: list[object] = []

    def create(*args: object, deny_devices: object, **kw: object) -> cgroup.Made:
        denied.append(deny_devices)
        return made

    monkeypatch.setattr(cgroup, "create", create)
    assert start(fenced_v2, {"CUDA_VISIBLE_DEVICES": "1"}) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert denied == [((195, 0),)]  # GPU 1 (minor 1) granted: minor 0 denied, by the v2 program
    os.close(log)
    text = (tmp_path / "log").read_text()
    assert "no cgroup of its own (refused by the kernel)" in text and "not fenced off" in text
    assert text.count("hopsmgr: refused: refused by the kernel") == 3, text  # the reason in the job's log
