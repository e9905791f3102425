"""``runctl proxy``: the model proxy as a process of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runctl.cli.app import app

proxy_app = typer.Typer(
    help="The model proxy: per-session OpenAI and Anthropic endpoints before vLLM.", no_args_is_help=True
)

app.add_typer(proxy_app, name="proxy")


@proxy_app.command("serve")
def proxy_serve(
    upstream: Annotated[
        list[str] | None,
        typer.Option("--upstream", help="A vLLM replica, http://HOST:PORT; repeat for several.", show_default=False),
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one).")] = 8760,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    trajectory_dir: Annotated[
        Path | None, typer.Option("--trajectory-dir", help="Write each closed session's trajectory here.")
    ] = None,
    discover_ray: Annotated[
        bool, typer.Option("--discover-ray", help="Also use the Ray cluster's vllm_server_* actors as replicas.")
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster for --discover-ray (default: RAY_ADDRESS).")
    ] = None,
    served_model: Annotated[
        str | None, typer.Option("--served-model", help="The served model name (default: asked of the replicas).")
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(
            "--alias",
            help="A model name (or fnmatch pattern) that means the served model; repeatable. Default: claude-*.",
        ),
    ] = None,
    advertise_host: Annotated[
        str | None, typer.Option("--advertise-host", help="Host to put in session URLs (default: --host).")
    ] = None,
) -> None:
    """Serve the proxy until Ctrl-C. Sessions are made with the admin API (see docs/services.md). Replicas that
    require a key (VLLM_API_KEY): give it in RUNCTL_PROXY_UPSTREAM_KEY."""
    import asyncio

    from services.proxy.library import DEFAULT_ALIASES, parse_upstream, serve, use_fast_loop

    upstreams = upstream or []
    if not upstreams and not discover_ray:
        raise typer.BadParameter("give at least one --upstream http://HOST:PORT, or --discover-ray.")
    for url in upstreams:
        try:
            parse_upstream(url)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--upstream") from None
    use_fast_loop()
    asyncio.run(
        serve(
            upstreams,
            host=host,
            port=port,
            advertise_host=advertise_host,
            trajectory_dir=trajectory_dir,
            served_model=served_model,
            aliases=tuple(alias) if alias else DEFAULT_ALIASES,
            discover_ray=discover_ray,
            ray_address=ray_address,
        )
    )
