//! Stage 3, binary refusal: output with NUL bytes, or mostly invalid UTF-8, is not shown to the
//! model (it would waste the budget on noise); the caller says how many bytes were withheld.

/// Share of bytes in invalid UTF-8 sequences above which output counts as binary.
const MAX_INVALID_SHARE: f64 = 0.3;

/// True when `bytes` should be withheld as binary.
pub fn is_binary(bytes: &[u8]) -> bool {
    if bytes.contains(&0) {
        return true;
    }
    if bytes.is_empty() || std::str::from_utf8(bytes).is_ok() {
        return false;
    }
    let invalid: usize = bytes.utf8_chunks().map(|chunk| chunk.invalid().len()).sum();
    invalid as f64 > bytes.len() as f64 * MAX_INVALID_SHARE
}

/// The text shown instead of binary output.
pub fn withheld_message(n_bytes: u64) -> String {
    format!(
        "[binary output withheld: {n_bytes} bytes (NUL bytes or invalid UTF-8). Inspect it with \
         `xxd`, `od -c` or `file`, or redirect it to a file.]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_binary_output() {
        let table: &[(&[u8], bool)] = &[
            (b"", false),
            (b"plain text\n", false),
            ("naïve café €".as_bytes(), false),
            (b"a\0b", true),
            (b"\x7fELF\x02\x01\x01\0\0\0", true),
            (b"mostly text with one bad byte \xff here", false),
            (b"\xff\xfe\xfd\xfc\xfb\xfa", true),
            (b"\x1b[31mred\x1b[0m", false),
        ];
        for (bytes, binary) in table {
            assert_eq!(is_binary(bytes), *binary, "{bytes:x?}");
        }
    }
}
