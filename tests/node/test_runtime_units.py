"""In-process units of hopsmgr.runtime: checkpoint files, settings from the environment, 2-means."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopsmgr.runtime import Runtime, Settings, bundle, checkpoint
from hopsmgr.runtime.files import atomic_write_json, read_json
from hopsmgr.runtime.stats import two_means


def test_checkpoints_are_verified_and_only_the_latest_two_kept(tmp_path: Path) -> None:
    for it in (1, 2, 3):
        checkpoint.save(tmp_path, it, {"it": it})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000002.json", "ckpt-000000002.pkl", "ckpt-000000003.json", "ckpt-000000003.pkl"]
    side = json.loads((tmp_path / "ckpt-000000003.json").read_text())
    assert side["iteration"] == 3 and side["size"] == (tmp_path / "ckpt-000000003.pkl").stat().st_size
    assert checkpoint.load_latest(tmp_path) == (3, {"it": 3})


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar", "missing"])
def test_load_latest_skips_a_damaged_newest_checkpoint(tmp_path: Path, damage: str) -> None:
    checkpoint.save(tmp_path, 5, "five")
    newest = checkpoint.save(tmp_path, 6, "six")
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "sidecar":
        checkpoint.sidecar_path(tmp_path, 6).write_text("{not json")
    else:
        newest.unlink()
    assert checkpoint.load_latest(tmp_path) == (5, "five")


def test_a_new_checkpoint_after_a_fallback_drops_the_corrupt_newer_one(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 5, "five")
    checkpoint.save(tmp_path, 9, "nine").write_bytes(b"garbage")
    checkpoint.save(tmp_path, 7, "seven")
    assert [c.iteration for c in checkpoint.list_checkpoints(tmp_path)] == [7, 5]
    assert checkpoint.load_latest(tmp_path) == (7, "seven")


def test_no_checkpoint_means_iteration_zero(tmp_path: Path) -> None:
    rt = Runtime(Settings(checkpoint_dir=tmp_path / "none"), install_signals=False)
    assert rt.resume() == (0, None) and rt.iteration == 0


def test_atomic_json_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    for i in range(3):
        atomic_write_json(target, {"i": i})
    assert read_json(target) == {"i": 2} and [p.name for p in tmp_path.iterdir()] == ["x.json"]
    with pytest.raises(ValueError):
        atomic_write_json(target, {"bad": float("nan")})
    assert read_json(target) == {"i": 2} and [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_settings_from_env() -> None:
    s = Settings.from_env(
        {"HOPS_MODE": "profile", "HOPS_GPUS": "4", "HOPS_LR_SCALE": "2.5", "HOPS_EMULATED_SPEED": "0.5"}
    )
    assert (s.mode, s.gpus, s.lr_scale, s.emulated_speed, s.profile_iters) == ("profile", 4, 2.5, 0.5, 20)
    assert Settings.from_env({}) == Settings()
    for var, value in [("HOPS_MODE", "train"), ("HOPS_GPUS", "0"), ("HOPS_EMULATED_SPEED", "fast")]:
        with pytest.raises(ValueError, match=var):
            Settings.from_env({var: value})


def test_runtime_properties_and_steps_in_process(tmp_path: Path) -> None:
    rt = Runtime(Settings(attempt_dir=tmp_path, gpus=2, lr_scale=2.0), install_signals=False)
    assert (rt.gpus, rt.lr_scale, rt.mode, rt.emulated_speed) == (2, 2.0, "run", 1.0)
    for _ in range(3):
        with rt.phase("data"), rt.phase("wait"):
            pass
        rt.step(samples=2)
    rt.finish()
    progress = read_json(tmp_path / "progress.json")
    assert progress is not None and progress["iteration"] == 3 and progress["samples"] == 6.0
    with pytest.raises(ValueError, match="unknown phase"), rt.phase("eval"):
        pass


def test_two_means_splits_bimodal_data_and_keeps_unimodal_data_whole() -> None:
    split = two_means([0.01] * 6 + [0.1] * 2)
    assert (split.hit_s, split.miss_s, split.p_cache) == pytest.approx((0.01, 0.1, 0.75))
    for values in ([0.02] * 8, [0.01, 0.011, 0.012, 0.013, 0.014], [1.0, 2.0, 3.0], []):
        s = two_means(values)
        assert s.p_cache == 1.0 and s.hit_s == s.miss_s


# -- what the framework integrations use -----------------------------------------------------------------


def test_count_records_a_step_without_acting_on_a_checkpoint_request(tmp_path: Path) -> None:

    rt = Runtime(Settings(attempt_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt"), install_signals=False)
    rt.start_at(7)
    rt.record_phase("forward", 0.01)
    rt.request_checkpoint()
    rt.count(4)  # does not exit: the caller saves in its framework's way
    assert rt.iteration == 8 and rt.checkpoint_requested
    with pytest.raises(SystemExit) as exit_info:
        rt.exit_checkpointed(None)
    assert exit_info.value.code == 75
    assert json.loads((tmp_path / "progress.json").read_text())["iteration"] == 8
    with pytest.raises(ValueError, match="unknown phase 'fwd'"):
        rt.record_phase("fwd", 1.0)
    with pytest.raises(RuntimeError, match="before the first step"):
        rt.start_at(3)


def test_a_bundle_round_trips_a_directory_and_refuses_paths_outside_it(tmp_path: Path) -> None:

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"\x00\x01")
    (src / "sub" / "b.json").write_text("{}")
    files = bundle.pack_dir(src)
    assert files == {"a.bin": b"\x00\x01", "sub/b.json": b"{}"}
    state = bundle.bundle("kind", 3, files)
    assert bundle.unbundle(state, "other") is None and bundle.unbundle(None, "kind") is None
    step, back = bundle.unbundle(state, "kind") or (0, {})
    out = bundle.unpack_dir(back, tmp_path / "out")
    assert step == 3 and bundle.pack_dir(out) == files
    with pytest.raises(ValueError, match="not a relative path"):
        bundle.unpack_dir({"../evil": b""}, tmp_path / "bad")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "bad").exists()


def test_the_runtime_imports_no_framework_until_an_integration_is_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hopsmgr.runtime, hopsmgr.runtime.loop, hopsmgr.runtime.bundle; "
        "print(sorted(m for m in ('torch', 'transformers', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_work_counts_iterations_at_the_smallest_gpu_count_and_survives_a_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    rt = Runtime(Settings(checkpoint_dir=ckpt, world_gpus=3, base_gpus=2), install_signals=False)
    assert rt.resume() == (0, None) and rt.work == 0.0
    assert rt.work_per_step == 1.5
    for _ in range(4):
        rt.count(10)
    assert (rt.iteration, rt.work, rt.done(6), rt.done(6.5)) == (4, 6.0, True, False)
    rt.save_checkpoint({"at": 4})
    after = Runtime(Settings(checkpoint_dir=ckpt, world_gpus=2, base_gpus=2), install_signals=False)
    assert after.resume() == (4, {"at": 4}) and after.work == 6.0
    after.count(10)
    assert (after.iteration, after.work, after.progress()["start_work"]) == (5, 7.0, 6.0)
    # thirds add up to whole iterations of work: 3 steps on 1 GPU of a job whose smallest count is 3
    thirds = Runtime(Settings(world_gpus=1, base_gpus=3), install_signals=False)
    for _ in range(3):
        thirds.count()
    assert thirds.done(1) and not thirds.done(2)


def test_a_checkpoint_without_work_resumes_its_iteration_as_work(tmp_path: Path) -> None:
    import pickle

    checkpoint.save(tmp_path, 7, "seven")
    data = checkpoint.data_path(tmp_path, 7)
    payload = pickle.dumps({"iteration": 7, "state": "seven"})  # as written before work was recorded
    data.write_bytes(payload)
    atomic_write_json(
        checkpoint.sidecar_path(tmp_path, 7),
        {"iteration": 7, "size": len(payload), "sha256": checkpoint._digest(payload)},
    )
    assert checkpoint.load_latest_record(tmp_path) == (7, 7.0, "seven")
    with pytest.raises(ValueError, match="work"):
        checkpoint.save(tmp_path, 8, None, work=float("nan"))


def test_start_at_takes_the_work_a_framework_kept_or_derives_it() -> None:
    rt = Runtime(Settings(world_gpus=4, base_gpus=2), install_signals=False)
    rt.start_at(10)
    assert rt.work == 20.0
    other = Runtime(Settings(world_gpus=4, base_gpus=2), install_signals=False)
    other.start_at(10, work=13.5)
    assert other.work == 13.5
    with pytest.raises(ValueError, match="work"):
        Runtime(Settings(), install_signals=False).start_at(1, work=-1.0)


def test_settings_read_the_smallest_gpu_count() -> None:
    assert Settings.from_env({"HOPS_WORLD_GPUS": "4", "HOPS_BASE_GPUS": "2"}).base_gpus == 2
    assert Settings.from_env({"HOPS_WORLD_GPUS": "4"}).base_gpus == 4  # standalone: one step is one
    with pytest.raises(ValueError, match="HOPS_BASE_GPUS"):
        Settings.from_env({"HOPS_BASE_GPUS": "0"})


def test_a_single_device_step_takes_the_batch_of_the_attempts_gpus(tmp_path: Path) -> None:
    assert Runtime(Settings(world_gpus=4, base_gpus=2), install_signals=False).step_batch(16) == 32
    assert Runtime(Settings(world_gpus=3, base_gpus=2), install_signals=False).step_batch(5) == 8  # 7.5
    assert Runtime(Settings(world_gpus=1, base_gpus=4), install_signals=False).step_batch(2) == 1  # profiling


def test_start_at_after_a_resume_keeps_the_work_the_checkpoint_recorded(tmp_path: Path) -> None:
    # an earlier attempt on 4 GPUs (R1 = 1) saved at step 10 with 40 of work; the framework of this
    # 1-GPU attempt resumes its own checkpoint at step 12: 40 + 2 steps of 1
    checkpoint.save(tmp_path, 10, None, work=40.0)
    rt = Runtime(Settings(checkpoint_dir=tmp_path, world_gpus=1, base_gpus=1), install_signals=False)
    rt.resume()
    rt.start_at(12)
    assert (rt.iteration, rt.work) == (12, 42.0)
