import importlib.util

import pytest

from tests.helpers import ROOT, SAMPLES


@pytest.fixture(scope="session")
def long_mlp_h5(tmp_path_factory):
    """samples/numnet_mlp.py, 60 steps: enough to hold a key down on."""
    from tests.conftest import _record

    return _record(tmp_path_factory, "mlp60", SAMPLES / "numnet_mlp.py", "--steps", "60")


@pytest.fixture(scope="session")
def rootless_h5(tmp_path_factory):
    """A recording whose modules have no root row, written as benchmarks/reader.py does."""
    spec = importlib.util.spec_from_file_location("bench_reader", ROOT / "benchmarks" / "reader.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path_factory.mktemp("rootless") / "bench.h5"
    bench.build(path, 8 * bench.ROWS_PER_STEP)
    return path
