-- The apps an audit entry's item belonged to before and after the change (JSON lists of names),
-- in columns of their own: who may read an entry is decided on these, not on the recorded JSON.
-- NULL: no such side (creation, deletion), or an item of no app (consumer limits).
ALTER TABLE audit_log ADD COLUMN apps_before TEXT;
ALTER TABLE audit_log ADD COLUMN apps_after TEXT;

-- Entries written before: a policy's apps, a token's apps (none for an unrestricted token).
UPDATE audit_log SET apps_before = COALESCE(json_extract(before_json, '$.apps'), '[]')
    WHERE kind IN ('policy', 'token') AND before_json IS NOT NULL;
UPDATE audit_log SET apps_after = COALESCE(json_extract(after_json, '$.apps'), '[]')
    WHERE kind IN ('policy', 'token') AND after_json IS NOT NULL;
