"""The router's heap setting: fixed on glibc, a no-op elsewhere."""

from __future__ import annotations

import platform

from router.process.heap import return_large_blocks


def test_the_mapping_threshold_is_fixed_where_the_c_library_is_glibc() -> None:
    assert return_large_blocks() is (platform.libc_ver()[0] == "glibc")
