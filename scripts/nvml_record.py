"""Record what NVML answers to the queries topology discovery makes, as JSON.

For every GPU: its bus id, name, compute capability, and for every NVLink index the P2P
capability, the link state (as a field value and through the older state call), the remote
PCI bus id and the remote device type, each the value or the NVML error's text. Taken by
``scripts/gpu-check`` so that a real machine's answers can be replayed in tests.

usage: python scripts/nvml_record.py OUT.json
"""

from __future__ import annotations

import json
import sys

import pynvml as nvml


def answer(call, *args):
    """The value of one NVML call made JSON-friendly, or {"error": text}."""
    try:
        value = call(*args)
    except nvml.NVMLError as exc:
        return {"error": str(exc)}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if hasattr(value, "busId"):
        bus = value.busId
        return bus.decode() if isinstance(bus, bytes) else bus
    if hasattr(value, "__len__") and len(value) and hasattr(value[0], "nvmlReturn"):  # field values
        return [{"return": v.nvmlReturn, "uiVal": int(v.value.uiVal)} for v in value]
    return value if isinstance(value, (int, float, str, list, tuple, type(None))) else str(value)


def record() -> dict:
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            links = []
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                links.append({
                    "link": link,
                    "p2p": answer(nvml.nvmlDeviceGetNvLinkCapability, handle, link, nvml.NVML_NVLINK_CAP_P2P_SUPPORTED),
                    "state_field": answer(nvml.nvmlDeviceGetFieldValues, handle, [(nvml.NVML_FI_DEV_NVLINK_GET_STATE, link)]),
                    "state": answer(nvml.nvmlDeviceGetNvLinkState, handle, link),
                    "remote_pci": answer(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link),
                    "remote_type": answer(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link),
                })
            gpus.append({
                "index": index,
                "busid": answer(nvml.nvmlDeviceGetPciInfo, handle),
                "name": answer(nvml.nvmlDeviceGetName, handle),
                "cuda_compute_capability": answer(nvml.nvmlDeviceGetCudaComputeCapability, handle),
                "links": links,
            })
        return {"driver": answer(nvml.nvmlSystemGetDriverVersion), "gpus": gpus}
    finally:
        nvml.nvmlShutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[0], "w") as out:
        json.dump(record(), out, indent=1)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
