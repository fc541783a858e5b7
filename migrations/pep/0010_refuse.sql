-- pep.refuse fails the statement that calls it, and so the transaction,
-- with SQLSTATE P0001 and the reason as its message. The gate's intent and
-- handle are each sent as one pipeline in an implicit transaction (one
-- round trip, no BEGIN or COMMIT of their own): a check that must undo the
-- whole of it (a limit reached, a handle another binder took) calls this
-- from the statement that finds it.
-- Rollback: an added function; older binaries never call it.
-- compatible-with: 0007
CREATE FUNCTION pep.refuse(reason text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = reason;
END
$$;
