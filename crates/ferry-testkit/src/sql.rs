//! SQL text shared by every backend.

/// `sql` with its `?` placeholders written as PostgreSQL's `$1, $2, …` when `postgres`: one
/// statement text for every backend.
pub fn placeholder(sql: &str, postgres: bool) -> std::borrow::Cow<'_, str> {
    if postgres {
        ferry_store::numbered_placeholders(sql).into()
    } else {
        sql.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        let sql = "UPDATE t SET a = ? WHERE b = ?";
        assert_eq!(placeholder(sql, false), sql);
        assert_eq!(placeholder(sql, true), "UPDATE t SET a = $1 WHERE b = $2");
    }
}
