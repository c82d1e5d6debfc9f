//! Who makes a change, and which items it may change: the authorisation the store applies
//! inside each change's own transaction.
//!
//! The server authenticates a token and knows its role; which *items* the token may touch
//! depends on rows (a policy's apps, a token's apps) that a concurrent change can move. So the
//! store re-reads the target row inside the write's transaction (locked on PostgreSQL), checks
//! the actor's apps against it there, and writes only then: no change can slip between the
//! check and the write, and no caller can skip the check by naming a row it never listed.

/// Who makes a change: the name recorded in `created_by`, `updated_by` and the audit log, and
/// the apps whose items it may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Actor<'a> {
    name: &'a str,
    /// Whether `name` is a token's, confirmed inside each change's transaction.
    token: bool,
    /// `None`: every item, global ones included. `Some`: only items all of whose apps are here.
    apps: Option<&'a [String]>,
}

impl<'a> Actor<'a> {
    /// An actor restricted to `apps` (`None`: unrestricted), as a token is.
    /// The store confirms, inside each change's transaction, that the token still exists
    /// with these apps: a token revoked while its request was under way changes nothing.
    pub fn new(name: &'a str, apps: Option<&'a [String]>) -> Self {
        Actor { name, token: true, apps }
    }

    /// An operator with the database in hand (the `tollgate token create` command, tests):
    /// unrestricted.
    pub fn operator(name: &'a str) -> Self {
        Actor { name, token: false, apps: None }
    }

    /// Whether the actor is a token (confirmed in each change) rather than an operator.
    pub(crate) fn is_token(&self) -> bool {
        self.token
    }

    /// The name recorded for the change.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The apps the actor is limited to; `None`: unrestricted.
    pub fn apps(&self) -> Option<&'a [String]> {
        self.apps
    }

    /// Whether the actor may change an item belonging to `apps`: unrestricted actors change
    /// everything; restricted ones only items all of whose apps they hold, never global ones
    /// (no apps), which belong to every app.
    pub fn may_change(&self, apps: &[String]) -> bool {
        match self.apps {
            None => true,
            Some(mine) => !apps.is_empty() && apps.iter().all(|a| mine.contains(a)),
        }
    }

    /// [`may_change`](Self::may_change), as the store's typed refusal.
    pub(crate) fn check(
        &self,
        kind: &'static str,
        name: &str,
        apps: &[String],
    ) -> Result<(), crate::StoreError> {
        if self.may_change(apps) {
            Ok(())
        } else {
            Err(crate::StoreError::OutOfScope {
                kind,
                name: name.to_owned(),
                actor: self.name.to_owned(),
                allowed: self.apps.unwrap_or_default().to_vec(),
            })
        }
    }
}
