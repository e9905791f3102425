"""An import-linter contract type of our own: each service is reached from outside its folder only through its face.

``services/<svc>/library.py`` is the one module of a service that code outside ``services/<svc>`` may import (the
CLI, another service where an arrow allows it, the contract never). import-linter's built-in types cannot say "this
package, but for one module": ``protected`` would refuse the face too, and ``forbidden`` cannot leave it out.
"""

from __future__ import annotations

from dataclasses import dataclass

import grimp
from importlinter import Contract, ContractCheck, fields, output


@dataclass(frozen=True)
class Trespass:
    importer: str
    imported: str
    lines: tuple[int, ...]


class FacesContract(Contract):
    """Configuration: ``services``, the service packages; ``face``, the one module name each exposes."""

    type_name = "faces"

    services = fields.ListField(subfield=fields.StringField())
    face = fields.StringField()

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        services: list[str] = list(self.services)  # type: ignore[call-overload]
        face = str(self.face)
        found: list[Trespass] = []
        missing = [svc for svc in services if f"{svc}.{face}" not in graph.modules]
        for svc in services:
            inside = {svc} | graph.find_descendants(svc)
            for imported in sorted(inside - {svc, f"{svc}.{face}"}):
                for importer in sorted(graph.find_modules_that_directly_import(imported) - inside):
                    details = graph.get_import_details(importer=importer, imported=imported)
                    found.append(Trespass(importer, imported, tuple(d["line_number"] for d in details)))
        return ContractCheck(kept=not found and not missing, metadata={"trespasses": found, "missing": missing})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for svc in check.metadata["missing"]:
            output.print_error(f"{svc} has no face: add {svc}.{self.face} with what others may use.", bold=False)
            output.new_line()
        for t in check.metadata["trespasses"]:
            svc = ".".join(t.imported.split(".")[:2])
            lines = ", ".join(map(str, t.lines))
            output.print_error(
                f"- {t.importer} -> {t.imported} (l.{lines}): import it from {svc}.{self.face}, the service's face "
                f"(export it there if others need it).",
                bold=False,
            )
            output.new_line()
