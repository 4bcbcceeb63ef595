"""Blobs in an object store over the S3 API (SeaweedFS, Ceph RGW, MinIO, AWS).

Modules: location (where: s3://BUCKET/PREFIX, endpoint, credentials, STORE/blobs.json),
remote (the bucket through obstore, errors mapped), packfmt (pack, index, dead,
adopted, reference and marker objects), table (the in-memory index), staging (local pack
files, uploaded; adoptions), store (S3BlobStore), pins (two stores on one bucket: what
one relies on in the other's packs, and the race with gc). obstore is imported only by
a store that uses a bucket.
"""
