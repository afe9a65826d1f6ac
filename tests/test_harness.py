"""The test suite's own harness: what ``make test``'s speed depends on."""

import pytest

from tests.conftest import one_worker

pytestmark = one_worker(__name__)


def test_a_group_runs_on_one_worker(request):
    """pytest-xdist (``--dist loadgroup``) sends the tests of one ``one_worker`` group to
    one worker by an "@group" it appends to their node ids. pytest 9.2 keeps pytest-xdist 3.8
    from writing it: there the groups are ignored, and each worker that draws a test of a
    group makes the group's shared runs again (requirements/tests.txt pins pytest below 9.2)."""
    if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers
        pytest.skip("not a pytest-xdist worker of a --dist loadgroup run")
    assert request.node.nodeid.endswith("@tests.test_harness"), (
        f"pytest {pytest.__version__} ran {request.node.nodeid!r} without its group"
    )
