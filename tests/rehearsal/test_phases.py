"""The phases in order from what the ranks wrote, and which phase a failure belongs to."""

from mmgcu.rehearsal.phases import Phase, all_passed, blame, failing_job, phases_of
from tests.rehearsal.helpers import rank

WRAP_MODEL_TRACEBACK = """Traceback (most recent call last):
  File "train.py", line 104, in <module>
  File "mmengine/runner/runner.py", line 429, in __init__
    self.model = self.wrap_model(self.cfg.get('model_wrapper_cfg'), self.model)
  File "mmgcu/engine/runner.py", line 112, in wrap_model
RuntimeError: card 1 is not there
"""


BUILT = ("build", "passed")


def statuses(phases):
    return [(p.name, p.status) for p in phases]


def test_phases_stop_at_the_first_failure(tmp_path):
    checkpoint = tmp_path / "iter_2.pth"
    checkpoint.write_bytes(b"x")
    train = {0: rank(0), 1: rank(1)}
    resume = {0: rank(0, 1, 2), 1: rank(1, 1, 2)}
    phases = phases_of(train, resume, 2, 2, str(checkpoint))
    assert [p.status for p in phases] == ["passed"] * 7 and all_passed(phases)
    misplaced = {0: rank(0), 1: dict(rank(1), param_devices=["cpu"])}
    phases = phases_of(misplaced, {}, 2, 2, str(checkpoint))
    assert statuses(phases)[:3] == [BUILT, ("placement", "failed"), ("wrap", "not run")]
    assert phases[1].detail == "parameters on ['xla:0'], ['cpu']"
    short = {0: rank(0, 1), 1: rank(1, 1)}
    phases = phases_of(short, {}, 2, 2, None)
    assert [p.status for p in phases] == ["passed"] * 3 + ["failed"] + ["not run"] * 3
    assert not all_passed(phases)
    unwrapped = {0: dict(rank(0), wrapped=False), 1: dict(rank(1), wrapped=False)}
    phases = phases_of(unwrapped, {}, 2, 2, str(checkpoint))
    assert phases[2] == Phase("wrap", "failed", "GCU1DistributedDataParallel")


def test_placement_is_each_rank_on_its_own_card_of_its_accelerators_kind(tmp_path):
    """The kind of card is what each rank's runner drives (its hook records the device
    type): parameters on another rank's card, or a rank off a GCU card, fail."""
    s60 = {r: dict(rank(r), device_type="gcu", param_devices=[f"gcu:{r}"]) for r in (0, 1)}
    assert statuses(phases_of(s60, {}, 2, 2, None))[1] == ("placement", "passed")
    swapped = {0: dict(rank(0), param_devices=["xla:1"]), 1: dict(rank(1), param_devices=["xla:0"])}
    assert statuses(phases_of(swapped, {}, 2, 2, None))[1] == ("placement", "failed")
    off_card = {r: dict(rank(r), device_type=None, param_devices=["cpu"]) for r in (0, 1)}
    assert statuses(phases_of(off_card, {}, 2, 2, None))[1] == ("placement", "failed")


def test_a_config_without_validation_skips_it(tmp_path):
    checkpoint = tmp_path / "iter_2.pth"
    checkpoint.write_bytes(b"x")
    train = {r: dict(rank(r), phases=[dict(name="build"), dict(name="train")]) for r in (0, 1)}
    resume = {0: rank(0, 1, 2), 1: rank(1, 1, 2)}
    phases = phases_of(train, resume, 2, 2, str(checkpoint), has_val=False)
    assert statuses(phases)[4:] == [("save", "passed"), ("val", "skipped"), ("resume", "passed")]
    assert all_passed(phases)


def test_a_failure_in_wrap_model_is_the_placements_not_the_builds():
    """No rank wrote a record: the build failed, unless the log shows the runner's
    wrap_model, where the model was built and putting it on its card failed."""
    phases = phases_of({}, {}, 2, 2, None)
    assert blame(phases, "KeyError: 'model'").name == "build"
    assert statuses(phases)[:2] == [("build", "failed"), ("placement", "not run")]
    failed = blame(phases, WRAP_MODEL_TRACEBACK)
    assert failed.name == "placement"
    assert statuses(phases)[:3] == [BUILT, ("placement", "failed"), ("wrap", "not run")]


def test_the_log_that_says_why_is_the_failed_jobs(tmp_path):
    checkpoint = tmp_path / "iter_2.pth"
    checkpoint.write_bytes(b"x")
    train = {0: rank(0), 1: rank(1)}
    failed_train = phases_of({0: rank(0, 1), 1: rank(1, 1)}, {}, 2, 2, None)
    assert failing_job(failed_train, 1) == 0
    failed_resume = phases_of(train, {0: rank(0, 0, 2)}, 2, 2, str(checkpoint))
    assert failing_job(failed_resume, 2) == 1
    resumed = {0: rank(0, 1, 2), 1: rank(1, 1, 2)}
    every_phase_passed = phases_of(train, resumed, 2, 2, str(checkpoint))
    assert failing_job(every_phase_passed, 2) == 1  # the last job failed as it ended
