"""An import-linter contract type for ARCHITECTURE.md's rule I10, which the built-in types cannot
state: no import cycle between modules.

import-linter's ``acyclic_siblings`` contract squashes each sibling package into one node, so it also
refuses two packages that import each other through different modules (``certificate.report_cli``
imports ``cli_usage``, which imports ``certificate.build``), and that is no cycle between modules.
This type walks the modules themselves; ``pyproject.toml`` registers it under ``contract_types``.
"""

from __future__ import annotations

import graphlib

from importlinter import Contract, ContractCheck, fields, output


class AcyclicModulesContract(Contract):
    """No import cycle among the modules of ``packages``. An import of a module's own package (or
    of a package above it) is Python's package loading and does not count, as the rules say."""

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        modules = set()
        for package in self.packages:
            modules |= {package} | graph.find_descendants(package)
        imports = {
            module: {
                imported
                for imported in graph.find_modules_directly_imported_by(module)
                if imported in modules and not module.startswith(imported + ".")
            }
            for module in modules
        }
        try:
            graphlib.TopologicalSorter(imports).prepare()
        except graphlib.CycleError as error:
            # graphlib lists each module before the one that imports it
            return ContractCheck(kept=False, metadata={"cycle": list(reversed(error.args[1]))})
        return ContractCheck(kept=True)

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("An import cycle between modules:")
        output.new_line()
        output.indent_cursor()
        output.print_error(" -> ".join(check.metadata["cycle"]), bold=False)
        output.new_line()
