//! Text tables as kubectl prints them: columns sized to their content.

/// Spaces between two columns (kubectl's tabwriter padding).
const COLUMN_GAP: usize = 3;

/// A row of header cells.
pub(crate) fn cells<const N: usize>(headers: [&str; N]) -> Vec<String> {
    headers.map(str::to_owned).into()
}

/// Rows as columns sized to their content, as kubectl prints a table: every
/// column but the last is as wide as its widest cell (in characters) plus
/// [`COLUMN_GAP`], so each column starts at the same offset on every row
/// whatever the names' lengths (an emptyDir's unique name carries the pod
/// UID); the last column is free text and not padded.
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        let padded = row.len().saturating_sub(1);
        for (i, cell) in row.iter().take(padded).enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) => *max = (*max).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths
                    .get(i)
                    .map_or(0, |w| w.saturating_sub(cell.chars().count()));
                line.extend(std::iter::repeat_n(' ', pad + COLUMN_GAP));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
