"""Named public traces: resolved through a data directory, fetched with SHA-256 checks.

The data directory is ``$KVSIM_DATA`` or, by default, ``~/.cache/kvsim/traces``.
Checksums and origins are those in ``../shared/traces/README.md``.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TraceError

_GH = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class NamedTrace:
    """A public trace file: where it is stored locally and where it comes from."""

    filename: str
    url: str
    sha256: str


NAMED_TRACES = {
    "azure-conv-2023": NamedTrace(
        "AzureLLMInferenceTrace_conv.csv",
        f"{_GH}/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/"
        "data/AzureLLMInferenceTrace_conv.csv",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"),
    "azure-code-2023": NamedTrace(
        "AzureLLMInferenceTrace_code.csv",
        f"{_GH}/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/"
        "data/AzureLLMInferenceTrace_code.csv",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),
    "splitwise-conv": NamedTrace(
        "splitwise_conv.csv",
        f"{_GH}/microsoft/vidur/7d47513363ec447a741ac5e47241580b47724fbf/"
        "data/processed_traces/splitwise_conv.csv",
        "439e4138b7e384f316de614c071f7162be05b8af0cef866f82faacd1b0472249"),
    "splitwise-code": NamedTrace(
        "splitwise_code.csv",
        f"{_GH}/microsoft/vidur/7d47513363ec447a741ac5e47241580b47724fbf/"
        "data/processed_traces/splitwise_code.csv",
        "f266b907d109d471c61283ab69771c17ad79a18b33ff6e96aa546346f52767a6"),
    "arxiv-summarization": NamedTrace(
        "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        f"{_GH}/microsoft/vidur/6d98aa8f71696520acc603d87439e77cc78160a7/"
        "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc"),
    "sharegpt-8k": NamedTrace(
        "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        f"{_GH}/project-etalon/etalon/d5f18de15a2227a2d469365afc4fa9e2df0c631d/"
        "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f"),
    "mooncake-conversation": NamedTrace(
        "conversation_trace.jsonl",
        f"{_GH}/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
        "FAST25-release/traces/conversation_trace.jsonl",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"),
}


def data_dir() -> Path:
    """The trace data directory: ``$KVSIM_DATA`` or ``~/.cache/kvsim/traces``."""
    env = os.environ.get("KVSIM_DATA")
    return Path(env) if env else Path.home() / ".cache" / "kvsim" / "traces"


def _lookup(name: str) -> NamedTrace:
    if name not in NAMED_TRACES:
        raise TraceError(f"unknown trace name {name!r}; known: {', '.join(NAMED_TRACES)}")
    return NAMED_TRACES[name]


def resolve_trace(name_or_path: str | Path) -> Path:
    """Returns an existing file path for a trace name or path. A name's file (in :func:`data_dir`, fetched or saved
    there by hand) is checked against the published SHA-256 each time it is used, so that a truncated or edited
    copy never stands for the public trace; a path is used as it is.

    Raises:
        TraceError: Unknown name, a known name whose file is absent (the message says where to put it and how to
            fetch it), or whose file is not the published one (kept; the message says what to do).
    """
    if Path(name_or_path).exists():
        return Path(name_or_path)
    if str(name_or_path) not in NAMED_TRACES:
        raise TraceError(f"{name_or_path}: no such file, and not a trace name "
                         f"(known: {', '.join(NAMED_TRACES)})")
    spec = NAMED_TRACES[str(name_or_path)]
    path = data_dir() / spec.filename
    if not path.is_file():
        raise TraceError(f"trace {name_or_path!r} is not in {data_dir()}: run "
                         f"'kvsim traces fetch {name_or_path}', or download {spec.url} "
                         f"and save it as {path} (set KVSIM_DATA to use another folder)")
    _check_published(path, str(name_or_path), spec)
    return path


def _check_published(path: Path, name: str, spec: NamedTrace) -> None:
    """Refuse a named trace's file that is not the published one (the file is left as it is).

    Raises:
        TraceError: naming the file, the trace and both digests.
    """
    stat = path.stat()
    got = _sha256_cached(str(path), stat.st_size, stat.st_mtime_ns)
    if got != spec.sha256:
        raise TraceError(f"{path}: SHA-256 mismatch for {name!r} (expected {spec.sha256}, got {got}): not the "
                         f"published trace (a truncated or edited copy?); the file was kept: replace it with "
                         f"{spec.url}, or give its path instead of the name to use it as it is")


@functools.lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    """:func:`sha256_of` once per file version in a process (a command that resolves one name twice, as
    ``traces stats`` does, hashes it once)."""
    return sha256_of(Path(path))


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    import hashlib         # only where a named trace is checked (start-up without OpenSSL's set-up, issue 32)

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fetch_trace(name: str, url: str | None = None, timeout_s: float = 60.0) -> Path:
    """Downloads a named trace into the data directory and verifies its SHA-256 before it is saved.

    Args:
        name: A key of :data:`NAMED_TRACES`.
        url: Override the download URL (e.g. a mirror or ``file://`` copy).
        timeout_s: Network timeout in seconds.

    Returns:
        The local path (already present files are only re-verified).

    Raises:
        TraceError: Download failure (e.g. offline) or checksum mismatch of the download (nothing is left at the
            destination); a file already there that is not the published one is kept and refused
            (:func:`resolve_trace`'s message).
    """
    spec = _lookup(name)
    dest = data_dir() / spec.filename
    if dest.is_file():
        _check_published(dest, name, spec)          # a user's file: checked, never removed
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _download(url or spec.url, dest, name, timeout_s, spec.sha256)
    return dest


def _download(url: str, dest: Path, name: str, timeout_s: float, sha256: str) -> None:
    """Download into a temporary file beside ``dest``, check its SHA-256, then rename it to ``dest``; on any
    failure the temporary file is removed and ``dest`` is not created."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        import urllib.request     # here, not at import: the CLI's parser does not need it
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as src:
            shutil.copyfileobj(src, out)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise TraceError(f"cannot download {name!r} from {url} ({err}); offline? Save "
                         f"the file as {dest} by hand") from None
    got = sha256_of(Path(tmp))
    if got != sha256:
        Path(tmp).unlink(missing_ok=True)
        raise TraceError(f"{dest}: SHA-256 mismatch for {name!r} (expected {sha256}, got {got}): the download "
                         f"from {url} is not the published trace; nothing was saved")
    os.replace(tmp, dest)
