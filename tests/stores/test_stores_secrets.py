"""A secret given to shardstream appears in nothing it prints, logs or raises, on any store.

Each case plants distinct secrets, all marked ``PLANTED``, in one of the forms a user may give
them (a URL's user info on s3/gs/az/http, storage options ``key``/``secret``/``token``/
``account_key``/``sas_token``/``connection_string``, a password in an endpoint URL, the
environment), then drives every command of the command line and the Python entry points into
a failure against the real test servers (moto, fake-gcs-server, the HTTP server, the fault
proxy answering 403) or a closed port on 127.0.0.1. Nothing that comes out (stdout, stderr,
log records, the exception's text, repr, chained causes and formatted traceback) may hold the
mark. Retries are cut to one try so that the unreachable endpoints fail at once.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import shardstream
from shardstream._cli import main
from shardstream._storage.options import ReadOptions
from tests.s3.conftest import fault_proxy, moto_endpoint  # noqa: F401 - fixtures used here
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import ACCESS_KEY, BUCKET, make_fs
from tests.stores import emulators
from tests.stores.httpserver import RangeServer
from tests.streaming.shards import make_dataset, tiny_jpeg

MARK = "PLANTED"


def planted(form: str) -> str:
    """A distinct secret for ``form`` (letters, digits and dashes: valid in any client)."""
    return f"{MARK}-{form}-Zq7x9w"


@dataclasses.dataclass
class Case:
    """A dataset URL (read from, or written to) and the options and environment it needs."""

    url: str
    options: dict[str, Any]
    env: dict[str, str] = dataclasses.field(default_factory=dict)


CASES = [
    "s3-url-userinfo", "gs-url-userinfo", "az-url-userinfo", "http-url-userinfo-missing",
    "http-url-userinfo-unreachable", "s3-options-missing-object", "s3-options-bad-bucket",
    "s3-options-denied", "s3-endpoint-password-unreachable", "s3-environment-missing-object",
    "gs-token-missing-object", "gs-endpoint-password-denied", "az-account-key-denied",
    "az-sas-token-denied", "az-connection-string-denied",
]  # fmt: skip


@pytest.fixture
def closed_port() -> int:
    return emulators.free_port()  # nothing listens on it: connections are refused


@pytest.fixture(scope="module")
def denying_proxy() -> Iterator[FaultProxy]:
    """An endpoint that answers every request 403 (Azure's and GCS's clients retry a refused
    connection for a minute, a denial not at all)."""
    proxy = FaultProxy(("127.0.0.1", emulators.free_port()))
    proxy.add(action="403", times=0)
    yield proxy
    proxy.stop()


@pytest.fixture
def case(
    request: pytest.FixtureRequest, moto_endpoint: str, fault_proxy: FaultProxy,  # noqa: F811
    http_server: RangeServer, gcs_server: str, closed_port: int, denying_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Case]:  # fmt: skip
    """The case named by the test's parameter, on a fresh moto bucket."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-planted-one")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _fresh_bucket(moto_endpoint)
    fault_proxy.clear()
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    made = _make_case(request.param, moto_endpoint, fault_proxy, http_server, gcs_server,
                      closed_port, denying_proxy.endpoint_url)  # fmt: skip
    for name, value in made.env.items():
        monkeypatch.setenv(name, value)
    yield made
    fault_proxy.clear()
    fsspec.AbstractFileSystem.clear_instance_cache()


def _fresh_bucket(endpoint_url: str) -> None:
    """An empty moto server with one empty bucket."""
    reset = urllib.request.Request(endpoint_url + "/moto-api/reset", method="POST")
    with urllib.request.urlopen(reset, timeout=10):
        pass
    make_fs(endpoint_url).mkdir(BUCKET)


def _make_case(
    name: str,
    moto: str,
    proxy: FaultProxy,
    http: RangeServer,
    gcs: str,
    closed: int,
    denied: str,
) -> Case:
    s3_options = {"endpoint_url": moto, "key": ACCESS_KEY, "secret": planted("secret"),
                  "token": planted("token")}  # fmt: skip
    gcs_options = {"endpoint_url": gcs, "project": "shardstream-test"}
    azure = emulators.AZURE_ACCOUNT
    account = f"AccountName={azure};BlobEndpoint={denied}/{azure};"
    cases = {
        "s3-url-userinfo": Case(f"s3://AKIAPLANTED0:{planted('s3-url')}@{BUCKET}/ds",
                                {"endpoint_url": moto}),
        "gs-url-userinfo": Case(f"gs://reader:{planted('gs-url')}@{BUCKET}/ds", gcs_options),
        "az-url-userinfo": Case(f"az://reader:{planted('az-url')}@container/ds", {}),
        "http-url-userinfo-missing": Case(
            f"http://reader:{planted('http-url')}@127.0.0.1:{http.address[1]}/no-such-ds", {}),
        "http-url-userinfo-unreachable": Case(
            f"http://reader:{planted('http-url')}@127.0.0.1:{closed}/ds", {}),
        "s3-options-missing-object": Case(f"s3://{BUCKET}/no-such-ds", s3_options),
        "s3-options-bad-bucket": Case("s3://no-such-bucket-here/ds", s3_options),
        "s3-options-denied": Case(f"s3://{BUCKET}/ds",
                                  {**s3_options, "endpoint_url": proxy.endpoint_url}),
        "s3-endpoint-password-unreachable": Case(
            f"s3://{BUCKET}/ds",
            {**s3_options, "endpoint_url": f"http://user:{planted('endpoint')}@127.0.0.1:{closed}"},
        ),
        "s3-environment-missing-object": Case(
            f"s3://{BUCKET}/no-such-ds", {"endpoint_url": moto},
            {"AWS_SECRET_ACCESS_KEY": planted("env"), "AWS_SESSION_TOKEN": planted("env-token")},
        ),
        "gs-token-missing-object": Case(f"gs://{BUCKET}/no-such-ds",
                                        {**gcs_options, "token": planted("gcs-token")}),
        "gs-endpoint-password-denied": Case(
            f"gs://{BUCKET}/ds",
            {**gcs_options, "token": "anon",
             "endpoint_url": denied.replace("//", f"//user:{planted('gcs-endpoint')}@")},
        ),
        # adlfs reaches an endpoint of our choosing through a connection string only; the
        # option of the secret's own name holds it too.
        "az-account-key-denied": Case("az://data/ds", {
            "account_key": planted("azure-key") + "AA==",
            "connection_string": f"{account}AccountKey={planted('azure-key')}AA==;"}),
        "az-sas-token-denied": Case("az://data/ds", {
            "sas_token": f"sv=2021-08-06&ss=b&sig={planted('sas')}",
            "connection_string": f"{account}SharedAccessSignature=sv=2021-08-06&ss=b&sig="
                                 f"{planted('sas')};"}),
        "az-connection-string-denied": Case("az://data/ds", {"connection_string": (
            f"DefaultEndpointsProtocol=http;{account}AccountKey={planted('conn')}AA==;")}),
    }  # fmt: skip
    if name == "s3-options-denied":
        proxy.add(action="403", times=0)
    return cases[name]


@pytest.fixture(autouse=True)
def one_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads give up after one failed try (an unreachable endpoint fails at once)."""
    defaults = {"max_attempts": 1, "backoff_s": 0.0, "max_backoff_s": 0.0}
    original = ReadOptions.__init__

    def init(self: ReadOptions, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**defaults, **kwargs})

    monkeypatch.setattr(ReadOptions, "__init__", init)


def _without_mark(text: str, where: str) -> None:
    assert MARK not in text, f"a planted secret appears in {where}:\n{text}"


def _check_error(error: BaseException, where: str) -> None:
    """Neither the exception nor anything chained to it shows a secret, formatted any way."""
    formatted = "".join(traceback.format_exception(error))
    _without_mark(formatted, f"the traceback of {where}")
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or any(current is other for other in seen):
            continue
        seen.append(current)
        shown = f"{current!s} {current!r} {current.args!r}"
        _without_mark(shown, f"a {type(current).__name__} raised by {where}")
        pending += [current.__cause__, current.__context__]


@pytest.fixture
def images(tmp_path: pathlib.Path) -> pathlib.Path:
    """A two-class ImageFolder of real JPEGs."""
    for index in range(4):
        folder = tmp_path / "images" / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index}.jpg").write_bytes(tiny_jpeg(index))
    return tmp_path / "images"


def _cli_commands(case: Case, images: pathlib.Path, tmp: pathlib.Path) -> dict[str, list[str]]:
    """Every subcommand, pointed at the case's URL (and a sibling URL where it writes)."""
    keys = tmp / "keys.txt"
    keys.write_text("class0/0\n")
    table = tmp / "table.csv"
    table.write_text("__key__,score\nclass0/0,1\n")
    other = case.url.rstrip("/") + "-other"
    return {
        "build": ["build", str(images), other, "--workers", "1"],
        "inspect": ["inspect", case.url],
        "verify": ["verify", case.url],
        "index": ["index", case.url],
        "view": ["view", case.url, other, "--fraction", "0.5"],
        "merge": ["merge", case.url],
        "bench": ["bench", case.url, "--workers", "0", "--batches", "1"],
        "prune": ["prune", case.url],
        "abandon": ["abandon", case.url],
        "exclude": ["exclude", case.url, "--keys", str(keys)],
        "compact": ["compact", case.url, "--workers", "1"],
        "dups": ["dups", case.url, "--workers", "1", "--work-dir", str(tmp / "work")],
        "attach": ["attach", case.url, str(table)],
    }


def _options_flags(options: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for name, value in options.items():
        flags += ["--storage-option", f"{name}={value}"]
    return flags


@pytest.mark.parametrize("case", CASES, indirect=True)
def test_no_cli_command_shows_a_secret(
    case: Case, images: pathlib.Path, tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    succeeded = []
    for command, argv in _cli_commands(case, images, tmp_path).items():
        try:
            status = main([*argv, *_options_flags(case.options), "--quiet"])
        except BaseException as error:  # a bug's traceback: it too must be clean
            _check_error(error, f"shardstream {command}")
            status = 1
        out, err = capsys.readouterr()
        _without_mark(out + err, f"the output of `shardstream {command}`")
        if status == 0:
            succeeded.append(command)
    # Only a build to a healthy bucket may succeed (its output is checked all the same).
    assert set(succeeded) <= {"build"}, f"these commands did not fail: {succeeded}"
    for record in caplog.records:
        _without_mark(logging.Formatter().format(record), f"the log record {record.name}")


def _entry_points(case: Case, images: pathlib.Path) -> dict[str, Callable[[], Any]]:
    options = case.options
    stream_options = shardstream.StreamOptions(storage_options=options)
    other = case.url.rstrip("/") + "-other"
    return {
        "build_shards": lambda: shardstream.build_shards(
            images, other, storage_options=options, workers=1
        ),
        "index_shards": lambda: shardstream.index_shards(case.url, storage_options=options),
        "read_manifest": lambda: shardstream.read_manifest(case.url, options),
        "Store.read_bytes": lambda: shardstream.Store(case.url, options).read_bytes("x.idx"),
        "StreamingDataset": lambda: list(
            shardstream.StreamingDataset(case.url, options=stream_options)
        ),
        "Stream": lambda: list(
            shardstream.StreamingDataset(
                [shardstream.Stream(case.url, proportion=1.0, storage_options=options)]
            )
        ),
        "RandomAccessDataset": lambda: shardstream.RandomAccessDataset(
            case.url, options=stream_options
        )[0],
        "make_view": lambda: shardstream.make_view(
            case.url, other, fraction=0.5, storage_options=options
        ),
        "exclude_samples": lambda: shardstream.exclude_samples(
            case.url, ["class0/0"], storage_options=options
        ),
        "merge_partitions": lambda: shardstream.merge_partitions(case.url, storage_options=options),
        "split_dataset": lambda: shardstream.split_dataset(
            case.url, other, {"train": 0.5, "val": 0.5}, storage_options=options
        ),
        "compact_dataset": lambda: shardstream.compact_dataset(
            case.url, workers=1, storage_options=options
        ),
        "attach_columns": lambda: shardstream.attach_columns(
            case.url, {"__key__": ["class0/0"], "score": [1]}, storage_options=options
        ),
        "find_duplicates": lambda: shardstream.find_duplicates([case.url], storage_options=options),
    }


@pytest.mark.parametrize("case", CASES, indirect=True)
def test_no_python_entry_point_shows_a_secret(
    case: Case, images: pathlib.Path, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    for name, call in _entry_points(case, images).items():
        try:
            call()
        except Exception as error:
            _check_error(error, name)
        else:  # only a build to a healthy bucket may succeed
            assert name == "build_shards", f"{name} did not fail"
    out, err = capsys.readouterr()
    _without_mark(out + err, "stdout/stderr")
    for record in caplog.records:
        _without_mark(logging.Formatter().format(record), f"the log record {record.name}")


def test_refused_url_names_the_safe_ways(moto_endpoint: str) -> None:  # noqa: F811
    """Credentials in an object store's URL are refused before any request, with the fix."""
    url = f"s3://AKIAPLANTED0:{planted('s3-url')}@{BUCKET}/ds"
    with pytest.raises(shardstream.ConfigError, match="cannot carry credentials") as raised:
        shardstream.read_manifest(url, {"endpoint_url": moto_endpoint})
    message = str(raised.value)
    assert "storage option" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "profile" in message and MARK not in message


def test_azure_container_at_account_stays_valid() -> None:
    """``az://container@account.host/...`` names a container, it is no credential."""
    store = shardstream.Store("az://data@account.blob.core.windows.net/ds")
    assert store.backend().name == "azure"


def test_a_dataloader_worker_failing_on_a_shard_shows_no_secret(
    moto_endpoint: str, fault_proxy: FaultProxy, images: pathlib.Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A real DataLoader worker formats its error before it crosses processes: the read of a
    shard whose connection is reset, through an endpoint URL with a password, must reach the
    training process without the password (nor the secret key)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-planted-one")
    fault_proxy.clear()
    _fresh_bucket(moto_endpoint)
    direct = {"endpoint_url": moto_endpoint, "key": ACCESS_KEY, "secret": planted("secret")}
    shardstream.build_shards(images, f"s3://{BUCKET}/worker-ds", storage_options=direct)
    endpoint = fault_proxy.endpoint_url.replace("//", f"//user:{planted('endpoint')}@")
    fault_proxy.add(action="reset", path_contains=".tar", times=0)
    options = shardstream.StreamOptions(storage_options={**direct, "endpoint_url": endpoint})
    dataset = shardstream.StreamingDataset(
        f"s3://{BUCKET}/worker-ds", batch_size=2, options=options
    )
    loader = shardstream.StreamingDataLoader(dataset, num_workers=1)
    with pytest.raises(shardstream.StorageError) as raised:
        list(loader)
    _check_error(raised.value, "a DataLoader worker")
    assert "worker" in str(raised.value).lower() and "***" in str(raised.value)
    for record in caplog.records:
        _without_mark(logging.Formatter().format(record), f"the log record {record.name}")


def test_reading_through_an_https_url_with_a_password_shows_it_nowhere(
    http_server: RangeServer, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """An HTTP(S) URL's user info stays supported (it is the request's credentials), and a
    successful read's summaries and logs do not show the password either."""
    caplog.set_level(logging.DEBUG)
    folder, manifest = make_dataset(tmp_path, num_samples=6, per_shard=3)
    shutil.copytree(folder, pathlib.Path(http_server.root) / "secret-ds")
    port = http_server.address[1]
    url = f"http://reader:{planted('http-read')}@127.0.0.1:{port}/secret-ds"
    assert main(["inspect", url]) == 0
    assert main(["verify", url]) == 0
    out, err = capsys.readouterr()
    assert f"{manifest.num_samples}" in out and "http://***@127.0.0.1" in out + err
    _without_mark(out + err, "the output of inspect and verify")
    dataset = shardstream.StreamingDataset(url, shuffle=False, decode="raw")
    assert len(list(dataset)) == manifest.num_samples
    assert MARK not in repr(shardstream.Store(url))
    for record in caplog.records:
        _without_mark(logging.Formatter().format(record), f"the log record {record.name}")
