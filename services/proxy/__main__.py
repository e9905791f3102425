"""``python -m services.proxy``: the standalone proxy process.

At this stage it joins the bus and answers health probes; the per-session OpenAI/Anthropic endpoints and
trajectory capture arrive with the proxy's own work (see docs/services.md).
"""

from runctl.service import ServiceRuntime, run_service


async def main(runtime: ServiceRuntime) -> None:
    runtime.health_info(lambda: {"serving": False, "note": "sessions not served yet"})


if __name__ == "__main__":
    run_service(main, "proxy")
