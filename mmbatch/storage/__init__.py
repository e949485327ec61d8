"""Object storage: the one place that knows URLs (``s3://``, ``gs://``, ``hf://``) and the file
systems behind them, and which protocols a URL may have at all (``urls.PROTOCOLS``: any
other is refused before fsspec is asked for it).

Sources and outputs ask this package, never ``open()`` a URL themselves:

* ``mmbatch.storage.urls``: which protocols are taken and how each is read, what a storage
  URL is, how one is joined, normalised and shown,
  and whether one lies under another (the path rule's test for URLs); no file system is
  touched there;
* ``mmbatch.storage.redaction``: what a failure's text may not hold (the credentials of the
  environment and those each file system resolved, the headers that carry them);
* ``mmbatch.storage.objects``: reading (bounded, with retries and timeouts), listing,
  writing whole objects, and local copies for the media that are decoded from a file.

Credentials are never handled here: each file system finds its own through its library's
standard chain (environment, configuration files, instance roles), and what is said of a
failure never holds a credential, wherever it was found (``redaction``).
"""
