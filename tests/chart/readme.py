"""The README's "Install on your cluster" commands, as written: each fenced block under a marker line
`<!-- readme-install: NAME ... -->`, split into commands (continuation lines joined) and words (shell quoting).
tests/chart/test_readme.py renders them against the chart; tests/e2e/test_readme_install_e2e.py runs them."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKER = re.compile(r"^<!-- readme-install: (?P<name>[a-z-]+)\b[^\n]*-->\n```sh\n(?P<body>.*?)^```$", re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Command:
    env: dict[str, str]  # leading NAME=value assignments
    words: list[str]

    def option(self, name: str) -> str | None:
        """The value of `--name VALUE` or `--name=VALUE`, or None."""
        for i, word in enumerate(self.words):
            if word == name and i + 1 < len(self.words):
                return self.words[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None

    def sets(self) -> list[tuple[str, str]]:
        """Every `--set KEY=VALUE`, in order."""
        pairs = []
        for i, word in enumerate(self.words):
            if word == "--set":
                key, _, value = self.words[i + 1].partition("=")
                pairs.append((key, value))
        return pairs

    def positional(self) -> list[str]:
        """The words that are neither options nor their values (`--flag value` pairs skipped for known ones)."""
        out, skip = [], False
        for word in self.words:
            if skip:
                skip = False
            elif word.startswith("-"):
                skip = "=" not in word and word in VALUED_OPTIONS
            else:
                out.append(word)
        return out


VALUED_OPTIONS = {"--namespace", "-n", "--set", "--values", "-f", "--kubeconfig", "--timeout"}


def blocks(text: str | None = None) -> dict[str, list[Command]]:
    """Every marked block of the README, by name."""
    found: dict[str, list[Command]] = {}
    for match in MARKER.finditer(README.read_text() if text is None else text):
        lines = match["body"].replace("\\\n", " ").splitlines()
        commands = []
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            env = {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            commands.append(Command(env=env, words=words))
        found[match["name"]] = commands
    return found


def one(commands: list[Command], *prefix: str) -> Command:
    """The one command that starts with these words."""
    matching = [c for c in commands if c.words[:len(prefix)] == list(prefix)]
    assert len(matching) == 1, f"expected one `{' '.join(prefix)}` command, found {len(matching)}"
    return matching[0]
