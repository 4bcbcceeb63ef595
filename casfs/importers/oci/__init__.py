"""OCI images: an OCI image layout (`oci:DIR[:TAG]`) or a `docker save` archive
(`docker-archive:FILE[:TAG]`), verified digest by digest and unpacked, layer over layer,
into one directory image.

    reference.py      the transport-prefixed source names skopeo uses
    digests.py        sha256/sha512 digests: parsing, hashing streams, checking
    layout.py         reading an OCI layout: index -> (platform) -> manifest -> config, layers
    dockerarchive.py  reading a docker-archive: manifest.json -> config, layers
    plan.py           what both readers give: the verified config and the layers to apply
    layers.py         applying a layer: whiteouts, opaque directories, replacements, hardlinks
    importer.py       the import: sharing a stored prefix of layers, verifying, applying
    runtime.py        an OCI runtime bundle's config.json from what the image remembers
"""
