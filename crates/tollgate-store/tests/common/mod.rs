//! What the store's test files share.

/// Runs each scenario (`async fn(&Store)`) on a fresh SQLite file and on a fresh database of a
/// private PostgreSQL cluster; after `postgres_only:`, scenarios that need PostgreSQL's row
/// locks (`async fn(&str, &Store)`, given the database's URL too).
macro_rules! on_both_drivers {
    ($($scenario:ident),* $(,)? $(; postgres_only: $($pg:ident),* $(,)?)?) => {
        #[tokio::test]
        async fn sqlite() {
            $(
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("t.db").display());
                $scenario(&Store::connect(&url).await.unwrap()).await;
            )*
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            let server = tollgate_testkit::PostgresServer::start();
            $(
                $scenario(&Store::connect(&server.fresh_database()).await.unwrap()).await;
            )*
            $($(
                let url = server.fresh_database();
                $pg(&url, &Store::connect(&url).await.unwrap()).await;
            )*)?
        }
    };
}
