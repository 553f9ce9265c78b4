-- Adds figures into a topic's stats hash: the promotions a scanner counted over a second
-- (promote_due.lua answers them), or a retired shard count's monitor counters, added into the
-- topic's first current shard's (the scanner's retirement, workers/scanner.py). Each field added,
-- but a max part, which keeps the greater.
-- KEYS[1] stats
-- ARGV[1...] per field: field, value
-- Returns how many fields it folded in.
-- @include fold
return fold_fields(KEYS[1], ARGV)
