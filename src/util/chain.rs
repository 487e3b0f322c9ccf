//! An error and its causes as one line, for logs, events and reports.

/// `e`'s text, then each of its sources' after `: `. A source whose text
/// the line already ends with is not repeated (foreign errors, tonic's
/// among them, often print their cause inline as well).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner: {0}")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn each_cause_once_in_order() {
        let io = std::io::Error::other("disk gone");
        // Inner prints its cause inline and as a source: shown once
        assert_eq!(error_chain(&Outer(Inner(io))), "outer: inner: disk gone");
    }
}
