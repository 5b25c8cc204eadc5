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
