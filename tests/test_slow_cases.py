"""The default run's slow list (tests/conftest.py's SLOW_CASES) names tests that exist: a test renamed or removed
would otherwise leave a stale entry, and a renamed test would silently come back into the default run."""

import re
from pathlib import Path

from tests.conftest import SLOW_CASES, is_slow_case

ROOT = Path(__file__).parents[1]


def test_every_entry_names_a_test_of_its_module():
    for module, entries in SLOW_CASES.items():
        text = (ROOT / module).read_text()
        for entry in entries:
            name = entry.lstrip("!").split("[")[0]
            if module.startswith("napari_gridmip/"):  # a docstring example: the module.function it documents
                assert f"def {name.rsplit('.', 1)[-1]}(" in text, (module, entry)
            elif "*" not in name:
                assert re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M), (module, entry)


def test_an_entry_without_parameters_marks_every_parametrisation():
    module = "tests/core/correlation/test_subsets.py"
    assert is_slow_case(f"{module}::test_the_selects_read_the_blocks_the_gathers_read[at_once-1]")
    assert is_slow_case(f"{module}::test_the_selects_read_the_blocks_the_gathers_read")
    assert not is_slow_case(f"{module}::test_the_selects_read_the_blocks_the_gathers_read_too")
    assert not is_slow_case(f"{module}::test_zero_variance_gives_zero_never_nan")


def test_a_kept_entry_wins_over_a_pattern():
    module = "tests/core/correlation/test_maps.py"
    assert is_slow_case(f"{module}::test_batch_axes[sweeps]")
    assert not is_slow_case(f"{module}::test_float32_against_float64_loop[shape0-window0-offsets_first-sweeps]")
