"""``python -m services.sandbox``: the sandbox service process.

At this stage it joins the bus and answers health probes; sandboxes, backends, the ledger and the reaper
arrive with the sandbox service's own work (see docs/services.md).
"""

from runctl.service import ServiceRuntime, run_service


async def main(runtime: ServiceRuntime) -> None:
    runtime.health_info(lambda: {"serving": False, "note": "sandboxes not served yet"})


if __name__ == "__main__":
    run_service(main, "sandbox")
