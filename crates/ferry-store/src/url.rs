//! Database URLs safe to print.

/// `url` with any password replaced by `***`, safe to print.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let redacted = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_string(),
    };
    format!("{}://{}@{}", &url[..scheme_end], redacted, &rest[at + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact_url("mysql://root@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert_eq!(
            redact_url("postgres://u:p@ss@h/db?x=1"),
            "postgres://u:***@h/db?x=1"
        );
    }
}
