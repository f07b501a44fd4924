"""The memory limit the kernel holds this process to: its container's ``limits.memory``, read
from its cgroup, so ``/metrics`` can say how close the process is to being OOM-killed.

cgroup v2 (OpenShift 4.14 and later, most current nodes) writes a cgroup's limit in
``memory.max`` (``max``: none); v1 in ``memory.limit_in_bytes`` of the ``memory`` hierarchy
(no limit reads as a number near 2**63). Where the process sits is in ``/proc/self/cgroup``:
``0::<path>`` in v2, ``<id>:memory:<path>`` in v1 (docs.kernel.org/admin-guide/cgroup-v2.html,
``Documentation/admin-guide/cgroup-v1/memory.rst``). A limit on any ancestor binds too, so the
least limit from the process's cgroup up to the hierarchy's root is the one that counts. In a
container with its own cgroup namespace the path is ``/`` and the mount's root is the container;
without one (v1 nodes) the path names the host's hierarchy, which the container's mount shows as
its root: then the mount's root file is the container's own.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUP = Path("/proc/self/cgroup")
# A limit this high is none: v1 writes "no limit" as the largest page-aligned counter
# (9,223,372,036,854,771,712 on 4 KiB pages).
_UNLIMITED = 1 << 62


def memory_limit(root: Path = CGROUP_ROOT, own: Path = OWN_CGROUP) -> int | None:
    """The least memory limit, in bytes, on this process's cgroup and its ancestors; ``None``
    where none is set or none can be read (not Linux, no cgroup mounted)."""
    try:
        lines = own.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    places: list[tuple[Path, str, str]] = []  # (mount, file, the cgroup's path)
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):  # v1 (or hybrid, where v1 holds the memory)
            places.insert(0, (root / "memory", "memory.limit_in_bytes", path))
        elif hierarchy == "0" and not controllers:
            places.append((root, "memory.max", path))
    if not places:
        return None
    mount, name, path = places[0]
    limits = [limit for d in _upwards(mount, path) if (limit := _limit(d / name)) is not None]
    return min(limits) if limits else None


def _upwards(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory under ``mount`` and each parent up to ``mount`` itself."""
    relative = PurePosixPath(path).relative_to("/") if path.startswith("/") else None
    if relative is None or ".." in relative.parts:
        return [mount]
    here = mount / relative
    return [here, *(mount / p for p in relative.parents)]


def _limit(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.isdigit():  # "max", or nothing a limit is written as
        return None
    value = int(text)
    return value if value < _UNLIMITED else None
