"""Object storage: the storages of ``s3://``, ``gs://`` and ``az://`` URLs.

Each meets the object protocol the storage layer defines
(:class:`~dp_ckpt_plugin.storage.objects.ObjectStorage`: get, put,
create-if-absent, compare-and-swap, list, delete), so a remote store and
the commands see one vocabulary:

- :mod:`.cloud`: S3, Google Cloud Storage and Azure through obstore;
- :mod:`.aws`: what S3 needs besides (botocore's credential chain, the
  multipart calls obstore does not make);
- :mod:`.registry`: one parser of a location, and the storage of a URL by
  its scheme (third parties add theirs through an entry point).

Nothing here touches a file: files are the storage layer's.
"""
