"""Parser and printer of the rule text format (docs/rules.md).

    # Comment lines right above a rule are its documentation.
    rule matmul-assoc:
      (matmul ?a (matmul ?b ?c)) => (matmul (matmul ?a ?b) ?c)

    rule merge-matmul:
      (matmul ?x ?w1 :activation ?act), (matmul ?x ?w2 :activation ?act)
      => let y = (matmul ?x (concat :axis -1 ?w1 ?w2) :activation ?act)
         in (split :axis -1 :sizes [(dim ?w1 -1) (dim ?w2 -1)] y).0,
            (split :axis -1 :sizes [(dim ?w1 -1) (dim ?w2 -1)] y).1

A file may declare what its rules are for before its first rule (`roles: normal-form,
search`), and a rule its own right after its name (graphsub.rules.roles); without a
declaration a rule is a search rule.

`print_rule(parse_rules(text)[0])` gives canonical text that parses back to the same rule
(roles included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphsub.errors import GraphsubError, OpAttributeError
from graphsub.ops import get_op
from graphsub.ops.base import REQUIRED
from graphsub.rules.ast import (AVar, Call, Expr, Lit, ListExpr, OpTerm, OutRef, Ref, Rule, Term,
                                Var)
from graphsub.rules.roles import DEFAULT_ROLES, Role, role_named, role_names


class RuleSyntaxError(GraphsubError):
    """A rule file does not follow the rule format."""


@dataclass(frozen=True)
class Token:
    kind: str  # ( ) [ ] , => : KEY VAR OUT PROJ NUM WORD COMMENT
    text: str
    line: int


_TOKEN = re.compile(r"""
    (?P<COMMENT>\#[^\n]*)
  | (?P<ARROW>=>)
  | (?P<PROJ>(?<=\))\.\d+)
  | (?P<PUNCT>[()\[\],=])
  | (?P<KEY>:[A-Za-z_][\w-]*)
  | (?P<COLON>:)
  | (?P<VAR>\?[A-Za-z_][\w-]*)
  | (?P<OUT>\$\d+)
  | (?P<NUM>[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?(?![\w.]))
  | (?P<WORD>[A-Za-z_+*/%-][\w.+*/%-]*)
  | (?P<SPACE>[ \t\r]+)
  | (?P<NEWLINE>\n)
""", re.VERBOSE)


def tokenize(text: str, origin: str = "<rules>") -> list[Token]:
    tokens: list[Token] = []
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise RuleSyntaxError(f"{origin}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "NEWLINE":
            line += 1
        elif kind != "SPACE":
            if kind == "PUNCT":
                kind = value
            elif kind == "ARROW":
                kind = "=>"
            elif kind == "COLON":
                kind = ":"
            tokens.append(Token(kind, value, line))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[Token], origin: str) -> None:
        self.toks = tokens
        self.i = 0
        self.origin = origin
        #: The roles the file declares for its rules (its header's), and where.
        self.file_roles = DEFAULT_ROLES
        self.declared_at: int | None = None

    # -- token helpers --
    def peek(self, offset: int = 0) -> Token | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def next(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise RuleSyntaxError(f"{self.origin}: unexpected end of file")
        self.i += 1
        return tok

    def expect(self, kind: str, text: str | None = None) -> Token:
        tok = self.next()
        if tok.kind != kind or (text is not None and tok.text != text):
            want = text or kind
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: expected {want!r}, found {tok.text!r}")
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == kind and (text is None or tok.text == text)

    # -- grammar --
    def rules(self) -> list[Rule]:
        out: list[Rule] = []
        comments: list[Token] = []
        while self.peek() is not None:
            tok = self.peek()
            assert tok is not None
            if tok.kind == "COMMENT":
                self.i += 1
                comments.append(tok)
                continue
            if tok.kind == "WORD" and tok.text == "rule":
                # A rule's documentation is the comment block right above it (no blank line).
                doc: list[str] = []
                line = tok.line
                for c in reversed(comments):
                    if c.line != line - 1:
                        break
                    doc.insert(0, c.text[1:].strip())
                    line = c.line
                out.append(self.rule("\n".join(doc)))
                comments = []
                continue
            if tok.kind == "WORD" and tok.text == "roles":
                self.file_header(tok, after_rule=bool(out))
                comments = []
                continue
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: expected 'rule', found {tok.text!r}")
        return out

    def file_header(self, tok: Token, after_rule: bool) -> None:
        """The file's `roles:` line: once, before its first rule (a declaration between
        rules would leave a reader unsure which rules it covers)."""
        if after_rule:
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: a file declares its roles before "
                                  "its first rule; a rule declares its own on the line after "
                                  "'rule NAME:'")
        if self.declared_at is not None:
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: the file's roles are declared "
                                  f"twice (first on line {self.declared_at})")
        self.declared_at = tok.line
        self.file_roles = self.roles()

    def roles(self) -> frozenset[Role]:
        """`roles: NAME, NAME ...`, each name a graphsub.rules.roles.Role."""
        self.expect("WORD", "roles")
        tok = self.next()
        if tok.kind == "KEY":  # roles:kernel, written without a space
            names = [Token("WORD", tok.text[1:], tok.line)]
        elif tok.kind == ":":
            names = [self.next()]
        else:
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: expected ':' after 'roles', found "
                                  f"{tok.text!r}")
        while self.at(","):
            self.next()
            names.append(self.next())
        out: set[Role] = set()
        for name in names:
            role = role_named(name.text) if name.kind == "WORD" else None
            if role is None:
                raise RuleSyntaxError(f"{self.origin}:{name.line}: unknown role {name.text!r}; "
                                      f"the roles are {role_names(Role)}")
            out.add(role)
        return frozenset(out)

    def skip_comments(self) -> None:
        while self.at("COMMENT"):
            self.i += 1

    def continues(self, kind: str, text: str | None = None) -> bool:
        """Whether the next token past any comments is this one; if so the comments (inside a
        rule) are skipped, otherwise they are left for the next rule's documentation."""
        j = self.i
        while j < len(self.toks) and self.toks[j].kind == "COMMENT":
            j += 1
        tok = self.toks[j] if j < len(self.toks) else None
        if tok is not None and tok.kind == kind and (text is None or tok.text == text):
            self.i = j
            return True
        return False

    def rule(self, doc: str) -> Rule:
        self.expect("WORD", "rule")
        name_tok = self.next()
        if name_tok.kind not in ("WORD", "NUM"):
            raise RuleSyntaxError(f"{self.origin}:{name_tok.line}: expected a rule name")
        self.expect(":")
        roles = self.roles() if self.at("WORD", "roles") else self.file_roles
        sources = [self.term(allow_refs=False)]
        self.skip_comments()
        while self.at(","):
            self.next()
            self.skip_comments()
            sources.append(self.term(allow_refs=False))
        self.skip_comments()
        self.expect("=>")
        self.skip_comments()
        lets: list[tuple[str, Term]] = []
        if self.at("WORD", "let"):
            self.next()
            while True:
                self.skip_comments()
                name = self.expect("WORD").text
                self.expect("=")
                lets.append((name, self.term(allow_refs=True)))
                self.skip_comments()
                if self.at(","):
                    self.next()
                    continue
                self.expect("WORD", "in")
                break
        self.skip_comments()
        targets = [self.term(allow_refs=True)]
        while self.continues(","):
            self.next()
            self.skip_comments()
            targets.append(self.term(allow_refs=True))
        conditions: list[Expr] = []
        if self.continues("WORD", "where"):
            self.next()
            self.skip_comments()
            conditions.append(self.expr())
            while self.continues(","):
                self.next()
                self.skip_comments()
                conditions.append(self.expr())
        if len(targets) != len(sources):
            raise RuleSyntaxError(f"{self.origin}: rule {name_tok.text}: {len(sources)} source "
                                  f"term(s) but {len(targets)} target term(s)")
        return Rule(name_tok.text, tuple(sources), tuple(targets), tuple(lets),
                    tuple(conditions), doc, self.origin, roles)

    def term(self, allow_refs: bool) -> Term:
        tok = self.next()
        if tok.kind == "VAR":
            return Var(tok.text[1:])
        if tok.kind == "WORD" and allow_refs:
            name, _, idx = tok.text.rpartition(".")
            if name and idx.isdigit():
                return Ref(name, int(idx))
            return Ref(tok.text)
        if tok.kind != "(":
            raise RuleSyntaxError(f"{self.origin}:{tok.line}: expected a term, found {tok.text!r}")
        op = self.expect("WORD").text
        attrs: list[tuple[str, Expr]] = []
        args: list[Term] = []
        while not self.at(")"):
            if self.at("KEY"):
                key = self.next().text[1:]
                attrs.append((key, self.expr()))
            else:
                args.append(self.term(allow_refs))
        self.expect(")")
        index = 0
        if self.at("PROJ"):
            index = int(self.next().text[1:])
        return OpTerm(op, tuple(attrs), tuple(args), index)

    def expr(self) -> Expr:
        tok = self.next()
        if tok.kind == "NUM":
            text = tok.text
            is_int = re.fullmatch(r"[-+]?\d+", text) is not None
            return Lit(int(text) if is_int else float(text))
        if tok.kind == "WORD":
            if tok.text in ("true", "false"):
                return Lit(tok.text == "true")
            if tok.text == "null":
                return Lit(None)
            return Lit(tok.text)
        if tok.kind == "VAR":
            return AVar(tok.text[1:])
        if tok.kind == "OUT":
            return OutRef(int(tok.text[1:]))
        if tok.kind == "[":
            items = []
            while not self.at("]"):
                items.append(self.expr())
            self.expect("]")
            return ListExpr(tuple(items))
        if tok.kind == "(":
            fn = self.expect("WORD").text
            args = []
            while not self.at(")"):
                args.append(self.expr())
            self.expect(")")
            return Call(fn, tuple(args))
        raise RuleSyntaxError(f"{self.origin}:{tok.line}: expected an expression, found {tok.text!r}")


def parse_rules(text: str, origin: str = "<rules>") -> list[Rule]:
    """Parse a rule file's text."""
    rules = _Parser(tokenize(text, origin), origin).rules()
    for rule in rules:
        _check_source_attributes(rule)
    return rules


def _check_source_attributes(rule: Rule) -> None:
    """A source term must write every attribute its operator requires: an unwritten one has
    no default to match, and a wildcard no check would draw (an unwritten attribute with a
    default matches only the default; see rules.matcher)."""
    def walk(t: Term) -> None:
        if not isinstance(t, OpTerm):
            return
        try:
            op = get_op(t.op)
        except OpAttributeError:
            return  # an unknown operator is reported where the rule is matched or checked
        written = {key for key, _ in t.attrs}
        missing = [spec.name for spec in op.attrs
                   if spec.default is REQUIRED and spec.name not in written]
        if missing:
            raise RuleSyntaxError(
                f"{rule.origin}: rule {rule.name}: ({t.op} ...) in its source leaves "
                f"{', '.join(missing)} unwritten, which {t.op} requires; bind it to match any "
                f"value ({' '.join(f':{m} ?{m}' for m in missing)})")
        for a in t.args:
            walk(a)

    for source in rule.sources:
        walk(source)


# ---- printer -----------------------------------------------------------------------------------

def print_expr(e: Expr) -> str:
    if isinstance(e, Lit):
        v = e.value
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "null"
        if isinstance(v, float):
            return repr(v)
        return str(v)
    if isinstance(e, AVar):
        return f"?{e.name}"
    if isinstance(e, OutRef):
        return f"${e.index}"
    if isinstance(e, ListExpr):
        return "[" + " ".join(print_expr(i) for i in e.items) + "]"
    return "(" + " ".join([e.fn] + [print_expr(a) for a in e.args]) + ")"


def print_term(t: Term) -> str:
    if isinstance(t, Var):
        return f"?{t.name}"
    if isinstance(t, Ref):
        return t.name + (f".{t.index}" if t.index else "")
    parts = [t.op] + [f":{k} {print_expr(v)}" for k, v in t.attrs] + [print_term(a) for a in t.args]
    return "(" + " ".join(parts) + ")" + (f".{t.index}" if t.index else "")


def print_rule(rule: Rule) -> str:
    lines = [f"# {line}" if line else "#" for line in rule.doc.splitlines()]
    lines.append(f"rule {rule.name}:")
    if rule.roles != DEFAULT_ROLES:
        lines.append(f"  roles: {role_names(rule.roles)}")
    lines.append("  " + ", ".join(print_term(s) for s in rule.sources))
    target = ", ".join(print_term(t) for t in rule.targets)
    if rule.lets:
        lets = ", ".join(f"{n} = {print_term(t)}" for n, t in rule.lets)
        lines.append(f"  => let {lets} in {target}")
    else:
        lines.append(f"  => {target}")
    if rule.conditions:
        lines.append("  where " + ", ".join(print_expr(c) for c in rule.conditions))
    return "\n".join(lines)


def print_rules(rules: list[Rule]) -> str:
    return "\n\n".join(print_rule(r) for r in rules) + "\n"
