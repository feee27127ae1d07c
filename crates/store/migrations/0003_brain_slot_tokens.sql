-- Each reservation of a brain slot carries a token of its own, so the release of an earlier
-- reservation never frees a later one of the same session.
ALTER TABLE brain_slots ADD COLUMN token text NOT NULL DEFAULT '';
