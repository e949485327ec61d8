"""Loading media: hashing, decoding and the decode-once store."""
