"""What every test shares: no test writes into the home directory of whoever runs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Turnout's data directory (the embedded default's batch store) under the session's
    temporary directory, for this process and every router it starts: each pytest-xdist
    worker has its own, so two runs, or two workers, never share a store."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
        yield
