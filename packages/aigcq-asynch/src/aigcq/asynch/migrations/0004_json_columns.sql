-- A database the Go service created may hold asynch_models.form and asynch_task.request_payload
-- as TEXT (JSON kept as text). Read back, such a value is a string: getModel answered form as a
-- JSON string, and a payload went to the model encoded twice. Convert them to JSONB: a value that
-- is not JSON is kept as a JSON string, an empty or NULL one becomes the empty value ([] / {}).
-- aigcq's own schema already has JSONB: nothing happens there.

CREATE FUNCTION pg_temp.asynch_as_jsonb(value text, empty jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR btrim(value) = '' THEN
        RETURN empty;
    END IF;
    RETURN value::jsonb;
EXCEPTION WHEN data_exception THEN  -- not JSON, or JSON that JSONB cannot hold (\u0000)
    RETURN to_jsonb(value);
END
$$;

DO $$
DECLARE
    col record;
BEGIN
    FOR col IN
        SELECT c.table_name, c.column_name, j.empty, j.has_default
        FROM information_schema.columns c
        JOIN (VALUES ('asynch_models', 'form', '[]', true),
                     ('asynch_task', 'request_payload', '{}', false))
            AS j(table_name, column_name, empty, has_default)
            ON j.table_name = c.table_name AND j.column_name = c.column_name
        WHERE c.table_schema = current_schema()
          AND c.data_type IN ('text', 'character varying', 'character')
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I DROP DEFAULT',
                       col.table_name, col.column_name);
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I TYPE jsonb'
                       ' USING pg_temp.asynch_as_jsonb(%I::text, %L::jsonb)',
                       col.table_name, col.column_name, col.column_name, col.empty);
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET NOT NULL',
                       col.table_name, col.column_name);
        IF col.has_default THEN
            EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET DEFAULT %L::jsonb',
                           col.table_name, col.column_name, col.empty);
        END IF;
    END LOOP;
END
$$;

DROP FUNCTION pg_temp.asynch_as_jsonb(text, jsonb);
