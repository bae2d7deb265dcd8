//! SQL text shared by every backend.

/// `sql` with its `?` placeholders written as PostgreSQL's `$1, $2, …` when `postgres`: one
/// statement text for every backend.
pub fn placeholder(sql: &str, postgres: bool) -> std::borrow::Cow<'_, str> {
    if !postgres {
        return sql.into();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(ch);
        }
    }
    out.into()
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
