-- A device is found by the hash of its token on every request: index the hash inside the record.
CREATE INDEX devices_token_sha256 ON devices ((record->>'token_sha256'));
