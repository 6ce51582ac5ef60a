-- The database's settled-batches table [dbo].[SqlQueue.Batches] (which claims each streaming batch read, and whether its sink settled it) and failed-claims table [dbo].[SqlQueue.Failed] (the claims its sink failed).
--
-- Generated from spark_qtransport.dialects.sqlserver.SqlServerDialect.create_batches() and rendered
-- with SqlServerDialect.script(): this is exactly what the connector runs, with its parameters
-- written as literals. tests/test_sqlserver_sql.py fails when this file and the code differ
-- (regenerate with SQLQUEUE_WRITE_SQL=1 pytest tests/test_sqlserver_sql.py -k script_files).
-- `sqlqueue ddl` prints the same script for other queue names.
--
-- Idempotent: does nothing when the table exists; otherwise creates it under the same
-- application lock as the NServiceBus installer (<table>_lock), so the two never race.
-- Runs as it is in sqlcmd (add -b to stop at the first error), SSMS or Azure Data Studio: its
-- first batch sets QUOTED_IDENTIFIER and ANSI_NULLS ON, which sqlcmd leaves OFF without -I.

SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

SET NOCOUNT ON;
DECLARE @table nvarchar(776) = N'[dbo].[SqlQueue.Batches]';
DECLARE @lock nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + @table + N'_lock';
DECLARE @rc int;
-- Fast path: the table exists, no lock is taken.
IF NOT EXISTS (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')
BEGIN
    BEGIN TRANSACTION;
    BEGIN TRY
        EXEC @rc = sys.sp_getapplock @Resource = @lock, @LockMode = N'Exclusive', @LockOwner = N'Transaction';
        IF @rc < 0 THROW 51000, N'sqlqueue: timed out waiting for the installer lock', 1;
        -- Check again under the lock: another installer may have been first.
        IF NOT EXISTS (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')
        BEGIN
            CREATE TABLE [dbo].[SqlQueue.Batches] (
                QueryId nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
                BatchId bigint NOT NULL,
                Claims nvarchar(776) COLLATE Latin1_General_BIN2 NOT NULL,
                Consumer nvarchar(200) COLLATE Latin1_General_BIN2 NOT NULL,
                TableId nvarchar(64) NOT NULL,
                AfterClaim bigint NOT NULL,
                UptoClaim bigint NOT NULL,
                SettledAt datetime2 NULL,
                ReadAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME()
            );
            CREATE UNIQUE NONCLUSTERED INDEX [Index_Batch] ON [dbo].[SqlQueue.Batches] (QueryId, BatchId, Claims, Consumer);
            CREATE NONCLUSTERED INDEX [Index_Claims] ON [dbo].[SqlQueue.Batches] (Claims, Consumer, UptoClaim);
            ALTER TABLE [dbo].[SqlQueue.Batches] SET (LOCK_ESCALATION = DISABLE);
        END
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- 2714 table and 1913 index already exist: created by someone not taking the lock
        -- (sys.objects may lag under load, says NServiceBus). The table is there: done.
        IF ERROR_NUMBER() IN (2714, 1913) AND XACT_STATE() = 1
            COMMIT TRANSACTION;
        ELSE
        BEGIN
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END
    END CATCH
END
GO

SET NOCOUNT ON;
DECLARE @table nvarchar(776) = N'[dbo].[SqlQueue.Failed]';
DECLARE @lock nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + @table + N'_lock';
DECLARE @rc int;
-- Fast path: the table exists, no lock is taken.
IF NOT EXISTS (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')
BEGIN
    BEGIN TRANSACTION;
    BEGIN TRY
        EXEC @rc = sys.sp_getapplock @Resource = @lock, @LockMode = N'Exclusive', @LockOwner = N'Transaction';
        IF @rc < 0 THROW 51000, N'sqlqueue: timed out waiting for the installer lock', 1;
        -- Check again under the lock: another installer may have been first.
        IF NOT EXISTS (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(@table) AND type = N'U')
        BEGIN
            CREATE TABLE [dbo].[SqlQueue.Failed] (
                TableId nvarchar(20) NOT NULL,
                ClaimSeq bigint NOT NULL,
                FailedAt datetime2 NOT NULL DEFAULT SYSUTCDATETIME(),
                PRIMARY KEY CLUSTERED (TableId, ClaimSeq)
            );
            ALTER TABLE [dbo].[SqlQueue.Failed] SET (LOCK_ESCALATION = DISABLE);
        END
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- 2714 table and 1913 index already exist: created by someone not taking the lock
        -- (sys.objects may lag under load, says NServiceBus). The table is there: done.
        IF ERROR_NUMBER() IN (2714, 1913) AND XACT_STATE() = 1
            COMMIT TRANSACTION;
        ELSE
        BEGIN
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END
    END CATCH
END
GO
