//! Web Push from the gateway to a person's browsers (RFC 8030), each message encrypted for its
//! subscription (RFC 8291, `aes128gcm`) and signed with the gateway's VAPID key (RFC 8292).
//!
//! [`Vapid`] is the key pair kept in the data directory; [`Subscription`] a browser's push
//! subscription, checked against the [`AllowedEndpoints`]; [`Payload`] the JSON a service worker
//! receives, and [`payload_for`] which events make one; [`Pusher`] the bounded queue and the one
//! task that sends, telling an [`Observer`] what came of each send (a push service that answers
//! 404 or 410 has dropped the subscription). The encryption is `web-push-native`'s, the JWT's ES256 signature `p256`'s.
//!
//! Deliberately absent: HTTP routes, devices and where subscriptions are stored (the gateway's),
//! and any retry: a push is best effort, and a lost one is not sent again.

mod payload;
mod pusher;
mod subscription;
mod vapid;

pub use payload::{Action, Payload, TurnStarts, payload_for};
pub use pusher::{Observer, Outcome, Push, Pusher, PusherConfig};
pub use subscription::{AllowedEndpoints, Endpoint, Subscription, SubscriptionError};
pub use vapid::{Vapid, VapidError, verify_token};
