"""Download files once into a cache folder: checksum checked, resumable, with a progress bar. The data sets
(`vitlab.data`) and pre-trained checkpoints (`vitlab.checkpoint`) both fetch through it, so it stands below both.

Safe for several processes at once (DDP ranks sharing one cache): each downloads into a partial file of its own,
`<name>.<host>-<pid>-<thread>.part`, and moves it into place with one atomic rename only after its checksum
matched, so no process writes into or deletes another's download, and the cache never holds a file that failed
its check. A partial file left by a process that has stopped is taken over and resumed with an HTTP Range request.

A file once verified is not hashed again on every load: `<name>.sha256` records its hash, size and mtime, and the
file is trusted while its size and mtime match (hashed again when they differ). Under DDP,
`vitlab.distributed.fetch_once` lets one process per machine download while the others wait.
Set `VITLAB_CACHE` to choose the cache folder and `VITLAB_MIRROR` to fetch every file from another base URL
(a file's `mirror_path` says where it is below it; a URL outside the data sets and the bucket has none).
`VITLAB_OFFLINE=1` (or the hub's own HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) forbids fetching pre-trained weights
(`offline_mode`).

The checksum is known in advance (the data sets' SHA-256) or, for files whose hash vitlab cannot ship (pre-trained
weights in a bucket, a URL), the one the server publishes: Google Cloud Storage's `x-goog-hash` (MD5, else
CRC32C), `Content-MD5`, or an ETag that is a SHA-256 (the Hugging Face hub's large files). A connection dropped
mid-file is resumed with a Range request, within the call (a few times, while bytes keep arriving) and by the
next run.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import http.client
import json
import os
import re
import socket
import threading
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from vitlab.environment import read_variable
from vitlab.errors import DataError
from vitlab.files import atomic_write_bytes, sha256_file

CHUNK = 1 << 16
TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class RemoteFile:
    name: str  # file name in the cache
    sha256: str | None  # None: checked against the hash the server publishes (`published_digests`)
    size: int  # bytes, for the progress bar (0: unknown)
    urls: tuple[str, ...]  # mirrors, tried in order
    mirror_path: str | None = None  # its path below $VITLAB_MIRROR: None, its name; "", never from the mirror


def cache_dir() -> Path:
    """$VITLAB_CACHE, else $XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab."""
    if read_variable("VITLAB_CACHE"):
        return Path(read_variable("VITLAB_CACHE"))
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vitlab"


def offline_mode(hub: bool = False) -> tuple[str, str] | None:
    """(variable, value) of the setting that forbids downloads, read when asked, or None: VITLAB_OFFLINE,
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE (any of them; the hub's named first for a hub name)."""
    settings = {
        "VITLAB_OFFLINE": read_variable("VITLAB_OFFLINE"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),  # the hub's own (not vitlab.environment's)
        "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE"),
    }
    variables = tuple(settings)
    for variable in variables[1:] + variables[:1] if hub else variables:
        if (settings[variable] or "").upper() in TRUE:
            return variable, settings[variable]
    return None


def sha256_of(path: Path) -> str:
    return sha256_file(path)  # the one SHA-256 reader (vitlab.files), which run checksums use too


def digests_of(path: Path, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """{"sha256": hex, and each of `extra` ("md5", "sha1", "git-sha1", "crc32c"): hex} of a file, read once.
    "git-sha1" is git's blob hash (SHA-1 of "blob <size>\\0" and the bytes), the ETag of a small file on the
    Hugging Face hub."""
    hashes = {"sha256": hashlib.sha256()}
    for name in extra:
        if name in ("md5", "sha1"):
            hashes[name] = hashlib.new(name)
        elif name == "git-sha1":
            hashes[name] = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    crc = 0 if "crc32c" in extra else None
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            for digest in hashes.values():
                digest.update(chunk)
            if crc is not None:
                crc = crc32c(chunk, crc)
    digests = {name: digest.hexdigest() for name, digest in hashes.items()}
    if crc is not None:
        digests["crc32c"] = f"{crc:08x}"
    return digests


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli polynomial, reflected
        table.append(crc)
    return table


CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of `data`, continuing from `crc`: the checksum Google Cloud Storage publishes for every
    object. Plain Python (a few MB/s), so used only where a server publishes no MD5."""
    crc ^= 0xFFFFFFFF
    table = CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def published_digests(headers) -> dict[str, str]:
    """The hashes a server publishes for a file, as lowercase hex: Google Cloud Storage's `x-goog-hash` (md5 and
    crc32c, base64; one header each or comma-separated), `Content-MD5` (base64) and an ETag (or the hub's
    `X-Linked-Etag`) that is a SHA-256 (64 hex digits). `headers`: an http.client / email message."""
    found: dict[str, str] = {}
    values = headers.get_all("x-goog-hash") or []
    for part in (item.strip() for value in values for item in value.split(",")):
        algorithm, _, encoded = part.partition("=")
        if algorithm.lower() in ("md5", "crc32c") and encoded:
            try:
                found[algorithm.lower()] = base64.b64decode(encoded, validate=True).hex()
            except ValueError:
                pass  # a malformed header checks nothing
    if "md5" not in found and headers.get("Content-MD5"):
        try:
            found["md5"] = base64.b64decode(headers["Content-MD5"], validate=True).hex()
        except ValueError:
            pass
    etag = normalized_etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
    if etag and re.fullmatch(r"[0-9a-f]{64}", etag):
        found["sha256"] = etag
    return found


def normalized_etag(etag: str | None) -> str | None:
    """An ETag without its weak marker and quotes, lowercased: 'W/"abc"' -> 'abc'."""
    if not etag:
        return None
    return etag.strip().removeprefix("W/").strip('"').lower()


def expected_digest(remote: RemoteFile, published: dict[str, str]) -> tuple[str, str] | None:
    """(algorithm, hex) to check a download of `remote` against: its own SHA-256, else the strongest hash the
    server published (sha256, md5, crc32c), else None."""
    if remote.sha256:
        return "sha256", remote.sha256
    for algorithm in ("sha256", "md5", "crc32c"):
        if algorithm in published:
            return algorithm, published[algorithm]
    return None


def partial_path(folder: Path, name: str) -> Path:
    """This process's (and thread's) own partial file for `name`: the host and pid say whose it is, so a later
    run can tell an abandoned download (its process gone) from one still going."""
    return folder / f"{name}.{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}.part"


def process_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate it there; never take over a partial file on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def take_over_abandoned(folder: Path, name: str, partial: Path) -> None:
    """Rename the partial file of a stopped process on this host to `partial`, so its bytes are resumed rather
    than fetched again. The rename is atomic: of two processes taking over the same file, one gets it."""
    if partial.exists():
        return
    host = socket.gethostname()
    for candidate in folder.glob(glob.escape(name) + ".*.part"):
        owner = candidate.name[len(name) + 1 : -len(".part")].rsplit("-", 2)
        if len(owner) != 3 or owner[0] != host or not owner[1].isdigit() or process_alive(int(owner[1])):
            continue
        try:
            os.rename(candidate, partial)
            return
        except FileNotFoundError:  # another process took it first
            continue


def verification_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def file_identity(stat: os.stat_result) -> dict:
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def record_verification(
    path: Path, sha256: str, stat: os.stat_result, record: Path | None = None, checked: str = "sha256"
) -> None:
    """Note that `path`, as it was at `stat`, has this hash, checked against `checked` (the hash it was compared
    with: sha256, or what its server published), in `record` (default `<name>.sha256` beside it); atomically, so
    concurrent readers see a whole record."""
    atomic_write_bytes(
        record or verification_path(path),
        json.dumps({"sha256": sha256, **file_identity(stat), "checked": checked}).encode(),
    )


def read_record(path: Path, record: Path | None = None) -> dict | None:
    try:
        data = json.loads((record or verification_path(path)).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_verified(path: Path, sha256: str | None, record: Path | None = None) -> bool:
    """Whether `path` holds the file with this hash: trusted from its record (`<name>.sha256`, or `record`) while
    its size and mtime are the recorded ones, else hashed (and, when it matches, recorded for the next load).
    With no hash to check against (sha256 None: a file checked against what its server published when it was
    downloaded), only the record can vouch for it."""
    before = path.stat()
    recorded = read_record(path, record) or {}
    if (
        recorded.get("sha256")
        and {k: recorded.get(k) for k in ("size", "mtime_ns")} == file_identity(before)
        and sha256 in (None, recorded["sha256"])
    ):
        return True
    if sha256 is None or sha256_of(path) != sha256:
        return False
    if file_identity(path.stat()) == file_identity(before):  # not changed while it was read
        record_verification(path, sha256, before, record)
    return True


def keep_for_inspection(path: Path) -> None:
    """Keep a failed cached file as `<name>.bad` (a hard link, so the name itself stays until a good download
    replaces it atomically: another process may be reading it, or about to replace it)."""
    bad = path.with_name(path.name + ".bad")
    try:
        bad.unlink(missing_ok=True)
        os.link(path, bad)
    except OSError:
        pass  # only a help for whoever looks into it; the download goes on without it


def candidate_urls(remote: RemoteFile) -> list[str]:
    mirror = read_variable("VITLAB_MIRROR")
    if mirror and remote.mirror_path != "":
        return [mirror.rstrip("/") + "/" + (remote.mirror_path or remote.name)]
    return list(remote.urls)


def head_digests(url: str, timeout: float) -> dict[str, str]:
    """The hashes `url`'s server publishes, from a HEAD request; {} when it publishes none or answers no HEAD
    (the GET's headers are read too)."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "vitlab"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return published_digests(response.headers)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return {}


def fetch(
    url: str,
    partial: Path,
    expected_size: int,
    progress: bool,
    timeout: float,
    label: str = "",
    headers_seen: list | None = None,
) -> None:
    """Append the rest of `url` to `partial`, resuming from its current size when the server allows it; `label`
    names the download on the progress bar. The response's headers are added to `headers_seen` as soon as they
    arrive (so a dropped connection keeps them)."""
    from tqdm import tqdm

    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "vitlab"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # nothing left to fetch: the partial file is already whole
            return
        raise
    if headers_seen is not None:
        headers_seen.append(response.headers)
    with response:
        if have and response.status != 206:
            have = 0  # the server ignored the Range header: start again
        length = response.headers.get("Content-Length")
        expected_total = have + int(length) if length and length.isdigit() else None
        mode = "ab" if have else "wb"
        with (
            open(partial, mode) as handle,
            tqdm(
                total=expected_size or None,
                initial=have,
                unit="B",
                unit_scale=True,
                desc=label or partial.name,
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            for chunk in iter(lambda: response.read(CHUNK), b""):
                handle.write(chunk)
                bar.update(len(chunk))
    if expected_total is not None and partial.stat().st_size < expected_total:
        raise ConnectionError(f"connection closed after {partial.stat().st_size} of {expected_total} bytes")


FETCH_ERRORS = (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException)


def fetch_resuming(
    url: str, partial: Path, expected_size: int, progress: bool, timeout: float, label: str = "", attempts: int = 4
) -> list:
    """`fetch`, resumed with a Range request when the connection drops after bytes arrived (up to `attempts`
    tries in all); an error that brought nothing is raised at once. Returns the headers of every response."""
    headers_seen: list = []
    for attempt in range(attempts):
        before = partial.stat().st_size if partial.exists() else 0
        try:
            fetch(url, partial, expected_size, progress, timeout, label, headers_seen)
            return headers_seen
        except FETCH_ERRORS:
            grew = (partial.stat().st_size if partial.exists() else 0) > before
            if not grew or attempt == attempts - 1:
                raise
    return headers_seen


def cached_copy(remote: RemoteFile, folder: Path | None = None) -> Path | None:
    """The verified copy of `remote` in the cache, or None (absent, changed, or never checked)."""
    final = (Path(folder) if folder is not None else cache_dir()) / remote.name
    try:
        return final if is_verified(final, remote.sha256) else None
    except FileNotFoundError:
        return None


def download(
    remote: RemoteFile,
    folder: Path | None = None,
    progress: bool = True,
    timeout: float = 60.0,
    error: type[Exception] = DataError,
    hint: str = "",
) -> Path:
    """The path of `remote` in the cache, downloading it first if needed. Raises `error` (DataError) when no
    mirror delivers a file with the right checksum; `hint` says what to do then (default: download it by hand
    into the cache folder or pass --data-dir)."""
    folder = Path(folder) if folder is not None else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / remote.name
    try:
        if is_verified(final, remote.sha256):
            return final
        keep_for_inspection(final)  # never used: replaced below once a good copy has arrived
    except FileNotFoundError:
        pass
    partial = partial_path(folder, remote.name)
    take_over_abandoned(folder, remote.name, partial)
    problems = []
    for url in candidate_urls(remote):
        published = {} if remote.sha256 else head_digests(url, timeout)
        try:
            responses = fetch_resuming(url, partial, remote.size, progress, timeout, label=remote.name)
        except FETCH_ERRORS as failure:
            problems.append(f"{url}: {getattr(failure, 'reason', failure)}")
            continue  # the partial file stays, so the next mirror (or the next run) resumes it
        for headers in responses if not remote.sha256 else []:
            published.update(published_digests(headers))  # a resumed (206) answer may publish none
        check = expected_digest(remote, published)
        digests = digests_of(partial, (check[0],) if check and check[0] != "sha256" else ())
        if check is not None and digests[check[0]] != check[1]:
            # A complete file with the wrong content: never keep it, or it would be "resumed" forever.
            partial.unlink()
            source = "expected" if remote.sha256 else "the server publishes"
            problems.append(
                f"{url}: checksum mismatch (got {check[0]} {digests[check[0]][:12]}..., {source} "
                f"{check[1][:12]}...); the downloaded file was deleted"
            )
            continue
        if check is None:
            warnings.warn(
                f"{url} publishes no checksum (x-goog-hash, Content-MD5 or a SHA-256 ETag), so "
                f"{remote.name} could not be verified; only its length was checked",
                stacklevel=2,
            )
        verified = partial.stat()
        # Atomic: a process that finishes the same file at the same time replaces it with identical bytes.
        os.replace(partial, final)
        record_verification(final, digests["sha256"], verified, checked=check[0] if check else "none")
        return final
    raise error(
        f"could not download {remote.name}: "
        + "; ".join(problems)
        + ". "
        + (hint or f"Download it by hand into {folder} or pass --data-dir with the files")
    )
