"""What a rule is for, as its rule file declares it.

One rule can serve several parts of graphsub: the GELU forms of `activations.rules` are read
back into one operator before every search (the normal form), are rules the search may apply,
and are how fission's kernel search recognises a GELU among primitives. Which part reads a
rule is said where the rule is written, not inferred from the name or folder of its file:

    roles: normal-form, search          # a rule file's header: every rule of the file

    rule softmax-kernel:
      roles: kernel                     # one rule's own, in place of its file's
      (div (exp ...) ...) => (softmax ?x ...)

A file that declares nothing holds search rules (`DEFAULT_ROLES`), as a rule file of the
user's, a generated one or TASO's `.pb` always has; what each role means is `Role`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol, TypeVar


class Role(StrEnum):
    """A part of graphsub that reads rules, by the name a rule file gives it."""

    #: Applied wherever they match until none does, before every search
    #: (graphsub.search.normal_form): rewrites that pay only as a chain.
    NORMAL_FORM = "normal-form"
    #: What the searches rewrite with (every algorithm, and the propagation after one).
    SEARCH = "search"
    #: Applied wherever they match until none does after the normal form, and kept as the
    #: search's start where predicted cheaper (graphsub.search.normal_form): sibling
    #: products merged, constant scales folded into the weights that read them, which pay
    #: where calls dominate (a decode step's matrix-vector products) and cost elsewhere.
    MERGE = "merge"
    #: Split a coarse operator into primitives (graphsub.fission: `fission_rules`).
    FISSION = "fission"
    #: Read primitives back as the one operator a library runs as a kernel (fission's
    #: candidate kernels: `kernel_rules`).
    KERNEL = "kernel"
    #: Rewrites among the primitives fission exposes (`primitive_rules`).
    PRIMITIVE = "primitive"
    #: Tidy a graph after kernel orchestration (`cleanup_rules`).
    CLEANUP = "cleanup"


#: The roles of a rule whose file declares none.
DEFAULT_ROLES: frozenset[Role] = frozenset({Role.SEARCH})

#: The roles a run reads from the rules it is given; fission reads its own roles from
#: graphsub's rule files (graphsub.fission.primitives), whatever a run is given.
RUN_ROLES: frozenset[Role] = frozenset({Role.NORMAL_FORM, Role.SEARCH, Role.MERGE})


def role_named(name: str) -> Role | None:
    """The role a rule file calls `name`, or None for a name no part of graphsub reads."""
    try:
        return Role(name)
    except ValueError:
        return None


def role_names(roles: Iterable[Role]) -> str:
    """`roles` as a rule file writes them: in `Role`'s order, comma-separated."""
    chosen = set(roles)
    return ", ".join(r.value for r in Role if r in chosen)


class HasRoles(Protocol):
    """Anything that declares roles (a rule)."""

    @property
    def roles(self) -> frozenset[Role]: ...


D = TypeVar("D", bound=HasRoles)


def with_role(rules: Iterable[D], role: Role) -> list[D]:
    """The rules among `rules` that declare `role`, in their order."""
    return [r for r in rules if role in r.roles]


__all__ = ["DEFAULT_ROLES", "HasRoles", "RUN_ROLES", "Role", "role_named", "role_names",
           "with_role"]
