"""Storage failures told as one line: what went wrong, and the fix that fits that cause.

A failed write or listing reaches the caller as a chain of exceptions (a refused connection,
wrapped by aiohttp, wrapped by botocore, wrapped by s3fs), or as a bare ``OSError`` with an
errno. :func:`explain` walks the chain and names the cause a user can act on: a full disk, a
read-only file system, a permission, missing credentials, an endpoint that does not answer, a
missing bucket or path. Exceptions of other libraries are recognised by name, so this module
imports none of them.
"""

from __future__ import annotations

import errno

__all__ = ["explain"]

_CONNECT = {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError",
            "ConnectionRefusedError", "ServerDisconnectedError"}  # fmt: skip
_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}  # fmt: skip


def _chain(error: BaseException) -> list[BaseException]:
    """The error and every exception it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not other for other in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _names(error: BaseException) -> set[str]:
    return {kind.__name__ for kind in type(error).__mro__}


def explain(error: BaseException, detail: bool = True) -> str | None:
    """One line for a storage failure anywhere in ``error``'s chain; None when it is not one.

    ``detail=False`` leaves out the underlying message (for an error that already shows it).

    Examples:
        >>> explain(OSError(errno.EROFS, "Read-only file system", "/data/x.tar"))
        "'/data/x.tar' is on a read-only file system: write to another folder"
    """
    chain = _chain(error)
    for cause in chain:
        names = _names(cause)
        text = f" ({str(cause).strip()})" if detail else ""
        if names & _CREDENTIALS or "Unable to locate credentials" in str(cause):
            return (
                f"the object store refused the credentials or found none{text}: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (--storage-option "
                "profile=NAME), or --storage-option anon=true for a public bucket"
            )
        if names & _CONNECT or isinstance(cause, ConnectionRefusedError):
            return (
                f"cannot connect to the storage endpoint{text}: check --storage-option "
                "endpoint_url=... (scheme, host and port) and that the server is running"
            )
    for cause in chain:
        if isinstance(cause, OSError) and (line := _os_error(cause)) is not None:
            return line
    return None


def _os_error(error: OSError) -> str | None:
    where = repr(error.filename) if error.filename else "the destination"
    if error.errno == errno.ENOSPC:
        return f"no space left on the device that holds {where}: free space, or write elsewhere"
    if error.errno == errno.EDQUOT:
        return f"disk quota exceeded writing {where}: free space in your quota, or write elsewhere"
    if error.errno == errno.EROFS:
        return f"{where} is on a read-only file system: write to another folder"
    if isinstance(error, PermissionError):
        if error.filename:
            return f"permission denied for {where}: check the folder's owner and permissions"
        return (
            f"access denied ({error}): check the credentials' permissions on the bucket and "
            "prefix (for example s3:GetObject, s3:PutObject, s3:ListBucket)"
        )
    if isinstance(error, FileNotFoundError):
        return f"not found: {error.filename or error}: check the path or URL (bucket and prefix)"
    if isinstance(error, TimeoutError):
        return f"the storage did not answer in time ({error}): check the network and endpoint"
    return f"{type(error).__name__}: {error}"
