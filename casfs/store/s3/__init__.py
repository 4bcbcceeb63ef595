"""Blobs in an object store over the S3 API (SeaweedFS, Ceph RGW, MinIO, AWS).

Modules: location (where: s3://BUCKET/PREFIX, endpoint, credentials, STORE/blobs.json),
remote (the bucket through obstore, errors mapped), packfmt (pack, index and dead
objects), table (the in-memory index), staging (local pack files, uploaded), store
(S3BlobStore). obstore is imported only by a store that uses a bucket.
"""
