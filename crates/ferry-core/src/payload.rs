//! An intent's payload: JSON text (the default) or opaque bytes (Avro, Protobuf, …).
use serde::{Deserialize, Serialize};

/// What a row carries as its message value. The sink sends [`Payload::as_bytes`] unchanged in
/// both cases; only an enqueue through the Rust API tells them apart (text must parse as JSON,
/// bytes are never inspected).
///
/// Serialised untagged: text as a JSON string, bytes as an array of numbers (0–255), so a JSON
/// line of `ferry enqueue` may carry either.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Payload {
    /// Text: the `payload` column (checked to be JSON at a Rust API enqueue; a plain `INSERT`
    /// may store any text).
    Text(String),
    /// Bytes: PostgreSQL's `payload_bytes BYTEA`, MariaDB's `payload_bytes LONGBLOB`, a BLOB in
    /// SQLite's `payload` column (docs/schema.md, "Binary payloads").
    Bytes(Vec<u8>),
}

impl Payload {
    /// The message value, exactly as stored (UTF-8 of the text, or the bytes).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Text(s) => s.as_bytes(),
            Self::Bytes(b) => b,
        }
    }

    /// The text, if this is a text payload.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(s) => Some(s),
            Self::Bytes(_) => None,
        }
    }

    /// The bytes, if this is a binary payload.
    pub fn as_binary(&self) -> Option<&[u8]> {
        match self {
            Self::Text(_) => None,
            Self::Bytes(b) => Some(b),
        }
    }

    /// Whether this is a binary payload.
    pub fn is_binary(&self) -> bool {
        matches!(self, Self::Bytes(_))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the payload has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored columns as (text, bytes): exactly one is `Some` (the schema's CHECK on
    /// PostgreSQL and MariaDB).
    pub fn columns(&self) -> (Option<&str>, Option<&[u8]>) {
        (self.as_text(), self.as_binary())
    }

    /// Reads the two stored columns back: text wins if set; a row with neither (impossible
    /// under the schema's CHECK) reads as empty bytes.
    pub fn from_columns(text: Option<String>, bytes: Option<Vec<u8>>) -> Self {
        match text {
            Some(s) => Self::Text(s),
            None => Self::Bytes(bytes.unwrap_or_default()),
        }
    }
}

impl Default for Payload {
    fn default() -> Self {
        Self::Text(String::new())
    }
}

impl From<String> for Payload {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<&str> for Payload {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(b: Vec<u8>) -> Self {
        Self::Bytes(b)
    }
}

impl PartialEq<str> for Payload {
    fn eq(&self, other: &str) -> bool {
        self.as_text() == Some(other)
    }
}

impl PartialEq<&str> for Payload {
    fn eq(&self, other: &&str) -> bool {
        self.as_text() == Some(*other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_kept_and_serde_tells_the_kinds_apart() {
        let raw = vec![0x00, 0xff, 0xc3, 0x28, 0x0a];
        let b = Payload::from(raw.clone());
        assert_eq!(b.as_bytes(), raw.as_slice());
        assert_eq!(b.columns(), (None, Some(raw.as_slice())));
        let t = Payload::from(r#"{"a":1}"#);
        assert_eq!(t, r#"{"a":1}"#);
        assert_eq!(t.as_bytes(), br#"{"a":1}"#);
        for p in [b, t] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Payload>(&json).unwrap(), p, "{json}");
        }
        assert_eq!(
            Payload::from_columns(None, Some(raw.clone())),
            Payload::Bytes(raw)
        );
    }
}
