"""``tools/check_dist.py``'s content checks (CI runs the whole build; these check what it looks for)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_dist  # noqa: E402

ENTRY_POINTS = "[console_scripts]\n" + "".join(
    f"{name} = {target}\n" for name, target in check_dist.console_scripts().items())


def complete_wheel():
    wheel, _ = check_dist.expected_files()
    return wheel + ["paged_mqa_logits-0.1.0.dist-info/licenses/LICENSE"]


def test_a_complete_wheel_and_sdist_pass():
    _, sdist = check_dist.expected_files()
    assert check_dist.wheel_problems(complete_wheel(), ENTRY_POINTS) == []
    assert check_dist.sdist_problems([f"paged_mqa_logits-0.1.0/{p}" for p in sdist]) == []


def test_every_table_the_tuner_the_license_and_the_scripts_are_required():
    wheel, sdist = check_dist.expected_files()
    assert "paged_mqa_logits/configs/sm_90_tuned.csv" in wheel and "paged_mqa_logits/tuner/__main__.py" in wheel
    assert {"LICENSE", "configs/sm_90_tuned.csv", "tuner/__main__.py"} <= set(sdist)
    names = [n for n in complete_wheel() if not n.endswith(("sm_90_tuned.csv", "LICENSE"))]
    problems = check_dist.wheel_problems(names, ENTRY_POINTS.replace("paged-mqa-logits-tune", "other"))
    assert problems == ["wheel lacks paged_mqa_logits/configs/sm_90_tuned.csv",
                        "wheel lacks the LICENSE (.dist-info/licenses/LICENSE)",
                        "wheel's entry_points.txt lacks paged-mqa-logits-tune = paged_mqa_logits.tuner.__main__:main"]
    assert check_dist.sdist_problems(["paged_mqa_logits-0.1.0/pyproject.toml"])[0] == "sdist lacks configs/" + (
        sdist[0].split("/", 1)[1])
