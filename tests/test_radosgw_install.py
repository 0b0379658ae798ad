"""``benchmarks/s3server/radosgw.sh install`` installs from the package lists already there, and
a failing ``apt-get update`` never stops it.

``apt-get``, ``dpkg-query``, ``id`` and ``ceph`` are small scripts on PATH that record their calls:
the install succeeds or fails as each case says, and nothing is installed for real.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).parent.parent / "benchmarks" / "s3server" / "radosgw.sh"

_APT_GET = """#!/usr/bin/env bash
echo "apt-get $1" >> "$STUB_DIR/calls"
case $1 in
update) exit "${UPDATE_STATUS:-0}" ;;
install)
    tries=$(grep -c 'apt-get install' "$STUB_DIR/calls")
    if ((tries > ${INSTALL_FAILS:-0})); then touch "$STUB_DIR/installed"; exit 0; fi
    exit 100 ;;
esac
"""
_DPKG_QUERY = """#!/usr/bin/env bash
[[ -f $STUB_DIR/installed ]] && printf 'install ok installed'
"""


def _install(tmp_path: pathlib.Path, update_status: int, install_fails: int) -> tuple[int, str]:
    """``(exit status, calls)`` of ``radosgw.sh install`` with the stubs."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in {
        "apt-get": _APT_GET,
        "dpkg-query": _DPKG_QUERY,
        "id": "#!/bin/sh\necho 0\n",
        "ceph": "#!/bin/sh\necho ceph 16\n",
    }.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_DIR": str(stubs),
           "UPDATE_STATUS": str(update_status), "INSTALL_FAILS": str(install_fails)}  # fmt: skip
    result = subprocess.run(["bash", str(SCRIPT), "install"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    calls = (stubs / "calls").read_text() if (stubs / "calls").exists() else ""
    return result.returncode, calls


@pytest.mark.parametrize(
    ("update_status", "install_fails", "status", "calls"),
    [
        (100, 0, 0, "apt-get install\n"),  # the lists there suffice: no update at all
        (100, 1, 0, "apt-get install\napt-get update\napt-get install\n"),  # update fails
        (0, 1, 0, "apt-get install\napt-get update\napt-get install\n"),
        (100, 2, 1, "apt-get install\napt-get update\napt-get install\n"),  # nothing installs
    ],
    ids=["lists-suffice", "update-fails", "update-needed", "install-fails"],
)
def test_install_tries_the_present_lists_first_and_goes_on_when_update_fails(
    tmp_path: pathlib.Path, update_status: int, install_fails: int, status: int, calls: str
) -> None:
    assert _install(tmp_path, update_status, install_fails) == (status, calls)
