"""What the kernels' policies and the benchmark need to know of the machine: the size of its L3."""

from __future__ import annotations

from pathlib import Path

L3_SIZE_FILE = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
# When the size cannot be read (not Linux, no L3 listed): the L3 of one core complex of a current server.
DEFAULT_L3_BYTES = 32 * 2**20


def l3_bytes(size_file: Path = L3_SIZE_FILE) -> int:
    """The L3 size the OS reports for CPU 0 ("32768K" in sysfs), or ``DEFAULT_L3_BYTES``.

    In a VM this can be a whole socket's L3, shared with other tenants (260 MiB on one of ours)."""
    try:
        text = size_file.read_text().strip()
        return int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]]
    except (OSError, ValueError, KeyError, IndexError):
        return DEFAULT_L3_BYTES
