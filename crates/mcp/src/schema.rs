//! JSON schemas for the tools' `inputSchema` and `outputSchema`, generated from the protocol
//! types and simplified for the widest range of MCP clients.
//!
//! The schemas declare no `$schema` dialect (validators in some clients accept only draft-07,
//! others only 2020-12; without the keyword both use the keywords we emit), inline every
//! subschema (no `$ref`), drop `"null"` from the types of optional fields (a model should omit
//! the field, not send `null`) and drop Rust-specific `format`s such as `uint64` that strict
//! validators reject as unknown. What remains is plain `type`/`properties`/`required`/`enum`/
//! `minimum`/`description`, which every client understands.

use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// The schema of what `T` accepts (an input schema).
pub fn input_schema<T: JsonSchema>() -> Arc<JsonObject> {
    generate::<T>(SchemaSettings::draft2020_12().for_deserialize(), &[])
}

/// The schema of what `T` serializes to, minus the properties in `omit` (an output schema).
pub fn output_schema<T: JsonSchema>(omit: &[&str]) -> Arc<JsonObject> {
    generate::<T>(SchemaSettings::draft2020_12().for_serialize(), omit)
}

fn generate<T: JsonSchema>(settings: SchemaSettings, omit: &[&str]) -> Arc<JsonObject> {
    let settings = settings.with(|s| {
        s.meta_schema = None;
        s.inline_subschemas = true;
    });
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut value = schema.to_value();
    simplify(&mut value);
    // A root schema is a JSON object (schemars only emits `true`/`false` for subschemas).
    let mut object = match value {
        Value::Object(object) => object,
        _ => JsonObject::new(),
    };
    object
        .entry("type")
        .or_insert_with(|| Value::String("object".into()));
    // The type's name and doc comment describe the Rust type, not the tool; the tool has its own
    // description.
    object.remove("title");
    object.remove("description");
    if !omit.is_empty() {
        if let Some(Value::Object(properties)) = object.get_mut("properties") {
            properties.retain(|name, _| !omit.contains(&name.as_str()));
        }
        if let Some(Value::Array(required)) = object.get_mut("required") {
            required.retain(|name| !name.as_str().is_some_and(|name| omit.contains(&name)));
        }
    }
    // Clients expect an object schema to list its properties even when there are none.
    object
        .entry("properties")
        .or_insert_with(|| Value::Object(JsonObject::new()));
    Arc::new(object)
}

/// Removes `null` from type unions, Rust integer `format`s and `$defs` (unused once inlined),
/// and unwraps descriptions, recursively.
fn simplify(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(Value::Array(types)) = object.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    object.insert("type".into(), only);
                }
            }
            if object
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(is_rust_integer_format)
            {
                object.remove("format");
            }
            object.remove("$defs");
            // Doc comments wrap lines; a model reads one sentence better than a broken one.
            if let Some(Value::String(description)) = object.get_mut("description") {
                *description = description.split_whitespace().collect::<Vec<_>>().join(" ");
            }
            for child in object.values_mut() {
                simplify(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

fn is_rust_integer_format(format: &str) -> bool {
    matches!(
        format,
        "int8"
            | "int16"
            | "int32"
            | "int64"
            | "uint8"
            | "uint16"
            | "uint32"
            | "uint64"
            | "uint"
            | "int"
            | "double"
            | "float"
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use warren_protocol::exec::{ExecCommandArgs, ExecResult, ListSessionsArgs};

    use super::*;

    #[test]
    fn exec_command_input_schema_is_plain_and_requires_only_cmd() {
        let schema = Value::Object(input_schema::<ExecCommandArgs>().as_ref().clone());
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["cmd"]));
        assert_eq!(schema["properties"]["cmd"]["type"], "string");
        assert_eq!(schema["properties"]["yield_time_ms"]["type"], "integer");
        assert_eq!(schema["properties"]["tty"]["type"], "boolean");
        assert_eq!(schema["properties"]["env"]["type"], "object");
        let description = schema["properties"]["timeout_ms"]["description"].as_str();
        assert!(
            description.is_some_and(|d| d.contains("code is 124")),
            "{description:?}"
        );
        let text = schema.to_string();
        for absent in ["$schema", "$ref", "$defs", "uint64", "null"] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
    }

    #[test]
    fn empty_argument_type_still_lists_properties() {
        let schema = input_schema::<ListSessionsArgs>();
        assert_eq!(schema.get("type"), Some(&json!("object")));
        assert_eq!(schema.get("properties"), Some(&json!({})));
    }

    #[test]
    fn output_schema_omits_the_rendered_text() {
        let schema = Value::Object(output_schema::<ExecResult>(&["text"]).as_ref().clone());
        assert!(schema["properties"].get("text").is_none());
        assert!(
            !schema["required"]
                .as_array()
                .expect("required")
                .contains(&json!("text"))
        );
        let statuses: Vec<&Value> = schema["properties"]["status"]["oneOf"]
            .as_array()
            .expect("status is one of its variants")
            .iter()
            .map(|variant| &variant["const"])
            .collect();
        assert_eq!(
            statuses,
            [
                &json!("exited"),
                &json!("running"),
                &json!("awaiting_input")
            ]
        );
    }
}
