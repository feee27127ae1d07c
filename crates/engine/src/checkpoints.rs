//! Each session's checkpoints (checkpoints.md): its workspace (and the agent's home, when the
//! agent runs in the hands) after every turn that used the hands, before a rewind, and at a
//! fork, kept deduplicated by `warren-checkpoint` in `sessions/<id>/checkpoints/` (`workspace/`
//! and `home/`, one store each), or with `--snapshots s3://…` in the bucket with this replica's
//! copy there. They also keep the files of hands that do not run (the hands' [`Keeper`]): a
//! pause stores one, an archive removes the trees it holds, a restore rebuilds them from it.
//!
//! A checkpoint's id is its workspace checkpoint's; the label in its root says why it was taken
//! (`reason`), after which turn, and the id of the home checkpoint taken with it. A turn that
//! changed nothing since the last checkpoint stores none (the quick check makes finding that
//! cheap). The walk, the restore and the rewind work on the session's directories on the
//! gateway's disk, every step beneath a directory reached without following a link
//! (`warren-checkpoint`), so what the sandbox does to its tree meanwhile can make a step fail
//! but never reach outside it. Hands reached by URL have no tree here: their execd walks its
//! workspace and streams every entry, with the content of only the files the last checkpoint
//! cannot vouch for (`warren_checkpoint::Known`); a rewind sends it a patch from the last
//! checkpoint to the target, which it applies whole or not at all; a fork into such hands
//! patches the new execd's tree from empty. Their agent home is not theirs to keep (the
//! agent runs elsewhere). What such an execd streams is treated as hostile input.
//!
//! One lock per session ([`SessionCheckpoints::last`]) orders takes, rewinds and forks, and
//! keeps the last checkpoint of each tree, the next take's quick check. After a take, the
//! retention rule (`--checkpoints-keep`, `--checkpoints-max-age`; the newest always stays)
//! deletes old checkpoints once there are a tenth more than kept, and their chunks go with them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::json;
use warren_checkpoint::{CheckpointStore, Config, Error, LocalDisk, Manifest};
use warren_protocol::gateway::EventBody;

use crate::engine_error::EngineError;
use crate::hands::snapshots::SnapshotInfo;
use crate::hands::{HandsError, HandsHold, Isolation, Keeper};
use crate::session::Session;
use warren_execd_client::{ExecdClient, Tree};

/// The most checkpoints one listing answers.
pub const MAX_PAGE: usize = 200;

/// The most files changed under a take that a listing or event names.
pub const MAX_CHANGED_UNDER: usize = 100;

/// Every session's checkpoints, opened on first use.
pub struct Checkpoints {
    /// `--snapshots s3://…`: the checkpoints go under each session's prefix there.
    objects: Option<warren_store::objects::Objects>,
    keep: usize,
    max_age: Duration,
    open: Mutex<HashMap<String, Arc<SessionCheckpoints>>>,
}

/// One stored checkpoint, as `GET …/checkpoints` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CheckpointInfo {
    pub id: String,
    /// The turn it follows (0: before the first).
    pub turn: u64,
    /// RFC 3339.
    pub created_at: String,
    pub files: u64,
    pub bytes: u64,
    pub files_changed: u64,
    /// Files that changed while the checkpoint read them (each stored as that read saw it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed_under: Vec<String>,
    /// `turn`, `rewind` (the state a rewind replaced), `fork` (a fork's first), `pause` (the
    /// files as the hands were paused, and archived), `files` (the person's changes through the
    /// files API, outside a turn).
    pub reason: String,
}

/// A page of checkpoints, newest first; `next` continues it (`before=`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CheckpointPage {
    pub checkpoints: Vec<CheckpointInfo>,
    pub next: Option<String>,
}

/// A checkpoint's trees, loaded.
pub struct Loaded {
    pub workspace: Manifest,
    pub home: Option<Manifest>,
}

/// The last checkpoint of each tree: the next take's quick check.
#[derive(Default)]
struct Last {
    loaded: bool,
    workspace: Option<Manifest>,
    home: Option<Manifest>,
}

/// One session's checkpoint stores.
pub struct SessionCheckpoints {
    pub workspace: Arc<CheckpointStore>,
    pub home: Arc<CheckpointStore>,
    last: Arc<tokio::sync::Mutex<Last>>,
}

impl Checkpoints {
    pub fn new(
        objects: Option<warren_store::objects::Objects>,
        keep: u32,
        max_age: Duration,
    ) -> Checkpoints {
        Checkpoints {
            objects,
            keep: keep.max(1) as usize,
            max_age,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SessionCheckpoints>>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The session's stores (made on first use).
    pub fn of(&self, session: &Session) -> Result<Arc<SessionCheckpoints>, EngineError> {
        if let Some(open) = self.open().get(&session.id) {
            return Ok(open.clone());
        }
        // What a restore writes belongs to the sandbox's user, as what it wrote itself.
        let config = Config {
            owner: session.hands.tree_owner(),
            ..Config::default()
        };
        let opened = Arc::new(match &self.objects {
            Some(objects) => SessionCheckpoints::in_bucket(
                objects,
                &session.id,
                &session.dir.join("checkpoints"),
                config,
            )?,
            None => SessionCheckpoints::open(&session.dir.join("checkpoints"), config)?,
        });
        Ok(self
            .open()
            .entry(session.id.clone())
            .or_insert(opened)
            .clone())
    }

    /// Has the session's checkpoints keep its files while its hands do not run: a pause stores
    /// one, an archive removes the trees it holds, a restore rebuilds them from the newest.
    pub fn keep_files_of(self: &Arc<Self>, session: &Arc<Session>) {
        session.hands.set_keeper(Arc::new(FilesKeeper {
            checkpoints: self.clone(),
            session: Arc::downgrade(session),
        }));
    }

    /// A checkpoint of the session's trees as they are now, labelled `reason`, or the newest
    /// when nothing changed since it.
    async fn keep(
        &self,
        session: &Session,
        reason: &'static str,
    ) -> Result<CheckpointInfo, EngineError> {
        let stores = self.of(session)?;
        let Some(trees) = Trees::of(session).await else {
            return Err(EngineError::Internal(
                "the session's workspace is neither on this disk nor in running hands".into(),
            ));
        };
        let turn = session.last_turn();
        let mut last = stores.last.lock().await;
        stores.load_last(&mut last).await?;
        match stores
            .take_locked(&mut last, &trees, turn, reason, true)
            .await?
        {
            Some((info, bytes_new, elapsed)) => {
                drop(last);
                self.retain(&stores).await;
                announce(session, turn, reason, &info, bytes_new, elapsed);
                Ok(info)
            }
            None => last
                .workspace
                .as_ref()
                .map(info_of)
                .ok_or_else(|| EngineError::Internal("no checkpoint was stored".into())),
        }
    }

    /// The session's newest checkpoint, if any: its root only, so a checkpoint whose entries
    /// are broken is still found (and its restore fails, said). A store that cannot be read
    /// is logged.
    pub async fn newest(&self, session: &Session) -> Option<CheckpointInfo> {
        let stores = self.of(session).ok()?;
        let last = stores.last.lock().await;
        if last.loaded {
            return last.workspace.as_ref().map(info_of);
        }
        let reading = stores.clone();
        let newest = blocking(move || {
            let Some(newest) = reading.workspace.page(None, 1)?.checkpoints.pop() else {
                return Ok(None);
            };
            Ok(Some(info_of(&reading.workspace.head(&newest.id)?)))
        })
        .await;
        drop(last);
        newest.unwrap_or_else(|e| {
            tracing::warn!(session = %session.id, error = %e, "cannot read the newest checkpoint");
            None
        })
    }

    /// Rebuilds the session's workspace (and agent home) from its newest checkpoint, whole or
    /// not at all; no sandbox uses them meanwhile. A broken checkpoint is an error, never a
    /// partial tree.
    async fn restore_newest(&self, session: &Session) -> Result<(), EngineError> {
        let stores = self.of(session)?;
        let mut last = stores.last.lock().await;
        let workspace_dir = session.hands.workspace().to_path_buf();
        let home_dir = session.hands.agent_home().map(Path::to_path_buf);
        let target = stores.clone();
        let (workspace, home) = blocking(move || {
            let Some(newest) = target.workspace.page(None, 1)?.checkpoints.pop() else {
                return Err(Error::NotFound("newest".into()));
            };
            let manifest = target.workspace.load(&newest.id)?;
            let home = match home_of(&manifest) {
                Some(id) => Some(target.home.load(&id)?),
                None => None,
            };
            let workspace = target.workspace.restore(&manifest, &workspace_dir, None)?;
            let home = match (home, home_dir) {
                (Some(manifest), Some(dir)) => Some(target.home.restore(&manifest, &dir, None)?),
                _ => None,
            };
            Ok((workspace, home))
        })
        .await?;
        *last = Last {
            loaded: true,
            workspace: Some(workspace),
            home,
        };
        Ok(())
    }

    /// Forgets a deleted session's stores.
    pub fn forget(&self, session_id: &str) {
        self.open().remove(session_id);
    }

    /// At the end of a turn that used the hands, before its `turn_end`: holds the session's
    /// checkpoint lock, so the next turn ([`Self::settled`]) cannot touch the hands until
    /// [`Self::after_turn`] has taken this one's checkpoint. `None` when the hands were not used.
    pub async fn reserve(&self, session: &Session) -> Option<Reserved> {
        if !session.hands.take_checkpoint_due() {
            return None;
        }
        let stores = match self.of(session) {
            Ok(stores) => stores,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "no checkpoint store");
                return None;
            }
        };
        let last = stores.last.clone().lock_owned().await;
        Some(Reserved { stores, last })
    }

    /// After `turn_end`: the reserved checkpoint, stored when something changed; a failure is
    /// an `error` event (the earlier checkpoints stay).
    pub async fn after_turn(&self, session: &Session, turn: u64, reserved: Reserved) {
        if let Err(e) = self.take_reserved(session, turn, "turn", reserved).await {
            session.emit(
                Some(turn),
                EventBody::Error {
                    code: "CHECKPOINT_FAILED".into(),
                    message: format!(
                        "the checkpoint after turn {turn} could not be taken ({e}); the earlier ones are kept"
                    ),
                },
            );
        }
    }

    /// Waits for a checkpoint still being taken (a turn's first step).
    pub async fn settled(&self, session: &Session) {
        let stores = self.open().get(&session.id).cloned();
        if let Some(stores) = stores {
            drop(stores.last.lock().await);
        }
    }

    /// Takes the reserved checkpoint of the session's trees, applies the retention rule and
    /// emits its `checkpoint` event. `None` when nothing changed since the last one (after a
    /// turn) or the session has no tree here.
    async fn take_reserved(
        &self,
        session: &Session,
        turn: u64,
        reason: &'static str,
        reserved: Reserved,
    ) -> Result<Option<CheckpointInfo>, EngineError> {
        let Reserved { stores, mut last } = reserved;
        let Some(trees) = Trees::of(session).await else {
            return Ok(None);
        };
        stores.load_last(&mut last).await?;
        let taken = stores
            .take_locked(&mut last, &trees, turn, reason, reason == "turn")
            .await?;
        drop(last);
        let Some((info, bytes_new, elapsed)) = taken else {
            return Ok(None);
        };
        // Old checkpoints go before this one is announced: a list read after the event
        // holds what is kept.
        self.retain(&stores).await;
        announce(session, turn, reason, &info, bytes_new, elapsed);
        Ok(Some(info))
    }

    /// Deletes what the retention rule drops, once there are a tenth more than kept, and the
    /// chunks only they used. A failure is logged: it costs space, never a checkpoint.
    async fn retain(&self, stores: &Arc<SessionCheckpoints>) {
        let (keep, max_age) = (self.keep, self.max_age);
        let stores = stores.clone();
        let swept = tokio::task::spawn_blocking(move || -> Result<(), Error> {
            let listed = stores.workspace.page(None, usize::MAX)?.checkpoints;
            let slack = (keep / 10).max(1);
            let too_old = listed.iter().skip(1).any(|c| {
                SystemTime::UNIX_EPOCH + Duration::from_millis(c.created_at_ms) + max_age
                    < SystemTime::now()
            });
            if listed.len() <= keep + slack && !too_old {
                return Ok(());
            }
            let dropped = warren_checkpoint::to_drop(&listed, keep, max_age, SystemTime::now());
            let mut kept_ws = Vec::new();
            let mut kept_home = Vec::new();
            for listed in listed.iter().filter(|l| !dropped.contains(&l.id)) {
                let manifest = stores.workspace.load(&listed.id)?;
                if let Some(home) = home_of(&manifest) {
                    kept_home.push(stores.home.load(&home)?);
                }
                kept_ws.push(manifest);
            }
            let home_ids: Vec<&str> = kept_home.iter().map(|m| m.id.as_str()).collect();
            for id in &dropped {
                stores.workspace.delete(id)?;
            }
            for listed in stores.home.page(None, usize::MAX)?.checkpoints {
                if !home_ids.contains(&listed.id.as_str()) {
                    stores.home.delete(&listed.id)?;
                }
            }
            stores
                .workspace
                .collect(&kept_ws.iter().collect::<Vec<_>>())?;
            stores.home.collect(&kept_home.iter().collect::<Vec<_>>())?;
            Ok(())
        })
        .await;
        match swept {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "checkpoint retention failed"),
            Err(e) => tracing::warn!(error = %e, "checkpoint retention panicked"),
        }
    }

    /// `GET …/checkpoints`: at most `limit` checkpoints older than `before`, newest first.
    pub async fn page(
        &self,
        session: &Session,
        before: Option<String>,
        limit: usize,
    ) -> Result<CheckpointPage, EngineError> {
        let stores = self.of(session)?;
        blocking(move || {
            if let Some(before) = &before {
                // An id that names nothing is 404, not an empty page.
                stores.workspace.head(before)?;
            }
            let page = stores.workspace.page(before.as_deref(), limit)?;
            let mut checkpoints = Vec::with_capacity(page.checkpoints.len());
            for listed in &page.checkpoints {
                checkpoints.push(info_of(&stores.workspace.head(&listed.id)?));
            }
            Ok(CheckpointPage {
                checkpoints,
                next: page.next,
            })
        })
        .await
    }

    /// Checkpoint `id` of the session, its entries loaded (the home's when asked).
    pub async fn load(
        &self,
        session: &Session,
        id: &str,
        with_home: bool,
    ) -> Result<(Arc<SessionCheckpoints>, Loaded), EngineError> {
        let stores = self.of(session)?;
        let id = id.to_owned();
        let loaded = {
            let stores = stores.clone();
            blocking(move || {
                let workspace = stores.workspace.load(&id)?;
                let home = match home_of(&workspace) {
                    Some(home) if with_home => Some(stores.home.load(&home)?),
                    _ => None,
                };
                Ok(Loaded { workspace, home })
            })
            .await?
        };
        Ok((stores, loaded))
    }

    /// The checkpoint taken just before `id` (the diff's default other side).
    pub async fn previous_of(
        &self,
        session: &Session,
        id: &str,
    ) -> Result<Option<String>, EngineError> {
        let stores = self.of(session)?;
        let id = id.to_owned();
        blocking(move || {
            let page = stores.workspace.page(Some(&id), 1)?;
            Ok(page.checkpoints.first().map(|c| c.id.clone()))
        })
        .await
    }

    /// `POST …/checkpoints/{id}/rewind`: the session's trees become checkpoint `id`'s, a
    /// checkpoint of what they held taken first. Refused while a turn runs.
    pub async fn rewind(
        &self,
        session: &Arc<Session>,
        id: &str,
        restart: bool,
    ) -> Result<CheckpointInfo, EngineError> {
        if session.running_turn().is_some() {
            return Err(EngineError::TurnRunning);
        }
        let (stores, target) = self.load(session, id, true).await?;
        // The trees are there and stay awake while they change (an archived session's come
        // back first).
        session.hands.endpoint().await?;
        let _hold = session.hands.hold();
        let Some(trees) = Trees::of(session).await else {
            return Err(EngineError::Hands(HandsError::Failed(
                "the session's hands are not running".into(),
            )));
        };
        let turn = session.last_turn();
        let mut last = stores.last.lock().await;
        stores.load_last(&mut last).await?;
        if session.running_turn().is_some() {
            return Err(EngineError::TurnRunning);
        }
        let saved = match stores
            .take_locked(&mut last, &trees, turn, "rewind", true)
            .await?
        {
            Some((info, bytes_new, elapsed)) => {
                announce(session, turn, "rewind", &info, bytes_new, elapsed);
                info.id
            }
            // Nothing changed since the last checkpoint: it is the saved state.
            None => last
                .workspace
                .as_ref()
                .map(|m| m.id.clone())
                .unwrap_or_default(),
        };
        let (workspace, home, target) = match trees {
            Trees::Disk { workspace, home } => {
                let stores = stores.clone();
                let current_ws = last.workspace.clone();
                let current_home = last.home.clone();
                blocking(move || {
                    let restored = stores.workspace.restore(
                        &target.workspace,
                        &workspace,
                        current_ws.as_ref(),
                    )?;
                    let home = match (&target.home, &home) {
                        (Some(manifest), Some(dir)) => {
                            Some(stores.home.restore(manifest, dir, current_home.as_ref())?)
                        }
                        _ => current_home,
                    };
                    Ok((Some(restored), home, target.workspace))
                })
                .await?
            }
            Trees::Execd { client, _hold } => {
                let current = last.workspace.clone().unwrap_or_else(Manifest::empty);
                patch_execd(&stores, &client, &target.workspace, current).await?;
                // The tree is the target's now: the next take counts its changes from there.
                // The patched files have new inodes, so it reads them again (the quick check
                // trusts no entry of theirs) and vouches for the files left alone.
                (
                    Some(target.workspace.clone()),
                    last.home.clone(),
                    target.workspace,
                )
            }
        };
        last.workspace = workspace;
        last.home = home;
        drop(last);
        session.hands.mark_changed();
        if restart {
            session.hands.restart().await;
        }
        let info = info_of(&target);
        session.set_rewound_notice(&info.id, info.turn, &info.created_at);
        session.emit(
            None,
            EventBody::Rewound {
                checkpoint: info.id.clone(),
                saved,
                restart,
            },
        );
        Ok(info)
    }

    /// A fork's trees: checkpoint `loaded` (of `from`, the stores of session `source`)
    /// restored into `to`'s (which no hands use yet) and stored as `to`'s first checkpoint.
    /// A file of `source`'s trees that the checkpoint's quick check still vouches for is
    /// copied in the kernel rather than rebuilt from its chunks.
    pub async fn seed(
        &self,
        from: &Arc<SessionCheckpoints>,
        loaded: Loaded,
        source: &Session,
        to: &Session,
    ) -> Result<(), EngineError> {
        let stores = self.of(to)?;
        if to.hands.isolation() == Isolation::Remote {
            return self.seed_execd(from, loaded, to, &stores).await;
        }
        let workspace_dir = to.hands.workspace().to_path_buf();
        let home_dir = to.hands.agent_home().map(Path::to_path_buf);
        let (source_workspace, source_home) = match Trees::of(source).await {
            Some(Trees::Disk { workspace, home }) => (Some(workspace), home),
            _ => (None, None),
        };
        let mut last = stores.last.lock().await;
        let from = from.clone();
        let target = stores.clone();
        let (workspace, home) = blocking(move || {
            target
                .workspace
                .import(&from.workspace, &loaded.workspace)?;
            let workspace = target.workspace.restore_from(
                &loaded.workspace,
                &workspace_dir,
                source_workspace.as_deref(),
            )?;
            let home = match (&loaded.home, home_dir) {
                (Some(manifest), Some(dir)) => {
                    target.home.import(&from.home, manifest)?;
                    Some(
                        target
                            .home
                            .restore_from(manifest, &dir, source_home.as_deref())?,
                    )
                }
                _ => None,
            };
            Ok((workspace, home))
        })
        .await?;
        last.loaded = true;
        last.workspace = Some(workspace);
        last.home = home;
        Ok(())
    }

    /// [`Self::seed`] for hands reached by URL: the checkpoint is stored as `to`'s first, then
    /// patched into its execd's tree (whatever that held is replaced). The next take reads
    /// every file once (their inodes are the new tree's).
    async fn seed_execd(
        &self,
        from: &Arc<SessionCheckpoints>,
        loaded: Loaded,
        to: &Session,
        stores: &Arc<SessionCheckpoints>,
    ) -> Result<(), EngineError> {
        let mut last = stores.last.lock().await;
        let imported = {
            let (from, target, manifest) = (from.clone(), stores.clone(), loaded.workspace);
            blocking(move || {
                target.workspace.import(&from.workspace, &manifest)?;
                Ok(manifest)
            })
            .await?
        };
        let endpoint = to.hands.endpoint().await?;
        let _hold = to.hands.hold();
        let client = endpoint.client()?;
        patch_execd(stores, &client, &imported, Manifest::empty()).await?;
        last.loaded = true;
        last.workspace = Some(imported);
        last.home = None;
        Ok(())
    }
}

/// Makes the tree of the execd behind `client` hold `target`: a patch from `current` (what it
/// holds now, as its last checkpoint says) streamed from the store as it is made; the execd
/// applies it whole or not at all.
async fn patch_execd(
    stores: &Arc<SessionCheckpoints>,
    client: &ExecdClient,
    target: &Manifest,
    current: Manifest,
) -> Result<(), EngineError> {
    let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let failed = sender.clone();
    let (store, target) = (stores.workspace.clone(), target.clone());
    let (made_tx, made_rx) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(sender));
        let made = store.patch(&target, &current, &mut out).and_then(|_| {
            out.flush()
                .map_err(|e| Error::Unavailable(format!("the hands' execd: {e}")))
        });
        if let Err(e) = &made {
            // The execd sees a broken body and changes nothing.
            let _ = failed.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
        let _ = made_tx.send(made.map(|_| ()));
    });
    let body = reqwest::Body::wrap_stream(futures_util::stream::poll_fn({
        let mut receiver = receiver;
        move |cx| receiver.poll_recv(cx)
    }));
    let applied = client.patch(Tree::Workspace, body).await;
    // A store failure is the cause of the execd's refusal: it is reported first.
    match made_rx.await {
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(())) => {}
        Err(_) => return Err(EngineError::Internal("the patch task ended".into())),
    }
    applied.map_err(|e| HandsError::Failed(format!("the hands' execd refused the rewind: {e}")))?;
    Ok(())
}

/// A blocking writer into a body channel.
struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>);

impl std::io::Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(bytes::Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The hands' [`Keeper`]: the session's checkpoints.
struct FilesKeeper {
    checkpoints: Arc<Checkpoints>,
    session: Weak<Session>,
}

impl FilesKeeper {
    fn session(&self) -> Result<Arc<Session>, String> {
        self.session
            .upgrade()
            .ok_or_else(|| "the session is gone".to_owned())
    }
}

fn kept(info: &CheckpointInfo) -> SnapshotInfo {
    SnapshotInfo {
        taken_at: info.created_at.clone(),
        bytes: info.bytes,
    }
}

impl Keeper for FilesKeeper {
    fn keep(
        &self,
        reason: &'static str,
    ) -> warren_brain::BoxFuture<'_, Result<SnapshotInfo, String>> {
        Box::pin(async move {
            let session = self.session()?;
            let info = self.checkpoints.keep(&session, reason).await;
            info.map(|info| kept(&info)).map_err(|e| e.to_string())
        })
    }

    fn newest(&self) -> warren_brain::BoxFuture<'_, Option<SnapshotInfo>> {
        Box::pin(async move {
            let session = self.session.upgrade()?;
            self.checkpoints
                .newest(&session)
                .await
                .map(|info| kept(&info))
        })
    }

    fn restore_newest(&self) -> warren_brain::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let session = self.session()?;
            let restored = self.checkpoints.restore_newest(&session).await;
            restored.map_err(|e| e.to_string())
        })
    }
}

/// A turn's checkpoint to come: the session's checkpoint lock, held ([`Checkpoints::reserve`]).
pub struct Reserved {
    stores: Arc<SessionCheckpoints>,
    last: tokio::sync::OwnedMutexGuard<Last>,
}

/// Where a session's checkpoints are read from and written to.
enum Trees {
    /// The directories on this disk (local hands): the workspace and the agent's home.
    Disk {
        workspace: PathBuf,
        home: Option<PathBuf>,
    },
    /// The workspace of hands reached by URL, through their execd (held awake meanwhile): it
    /// streams what changed since the last checkpoint, and applies a rewind's patch.
    Execd {
        client: ExecdClient,
        _hold: HandsHold,
    },
}

impl Trees {
    /// The session's trees; `None` when they are neither on this disk nor in running hands.
    async fn of(session: &Session) -> Option<Trees> {
        if session.hands.isolation() == Isolation::Remote {
            let (endpoint, hold) = session.hands.running_endpoint().await?;
            let client = endpoint.client().ok()?;
            return Some(Trees::Execd {
                client,
                _hold: hold,
            });
        }
        let workspace = session.hands.workspace().to_path_buf();
        if !workspace.is_dir() {
            return None;
        }
        Some(Trees::Disk {
            workspace,
            home: session
                .hands
                .agent_home()
                .filter(|home| home.is_dir())
                .map(Path::to_path_buf),
        })
    }
}

impl SessionCheckpoints {
    fn open(dir: &Path, config: Config) -> Result<SessionCheckpoints, EngineError> {
        let store = |name: &str| -> Result<Arc<CheckpointStore>, EngineError> {
            let disk = LocalDisk::open(&dir.join(name))?;
            Ok(Arc::new(CheckpointStore::new(Arc::new(disk), config)))
        };
        Ok(SessionCheckpoints {
            workspace: store("workspace")?,
            home: store("home")?,
            last: Arc::new(tokio::sync::Mutex::new(Last::default())),
        })
    }

    /// The stores under the session's prefix of the object store (`…/checkpoints/workspace`
    /// and `…/home`), with this replica's copy in `dir` ([`warren_checkpoint::Cached`]); their
    /// requests run on the current runtime.
    fn in_bucket(
        objects: &warren_store::objects::Objects,
        session_id: &str,
        dir: &Path,
        config: Config,
    ) -> Result<SessionCheckpoints, EngineError> {
        let prefix = objects
            .session_prefix(session_id)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let store = |name: &str| -> Result<Arc<CheckpointStore>, EngineError> {
            let bucket = warren_checkpoint::Bucket::new(
                objects.store(),
                &format!("{prefix}/checkpoints/{name}"),
                tokio::runtime::Handle::current(),
            )?;
            let copy = LocalDisk::open(&dir.join(name))?;
            Ok(Arc::new(CheckpointStore::new(
                Arc::new(warren_checkpoint::Cached::new(
                    Arc::new(bucket),
                    Arc::new(copy),
                )),
                config,
            )))
        };
        Ok(SessionCheckpoints {
            workspace: store("workspace")?,
            home: store("home")?,
            last: Arc::new(tokio::sync::Mutex::new(Last::default())),
        })
    }

    /// Loads the newest checkpoint's trees, once (after a gateway start).
    async fn load_last(self: &Arc<Self>, last: &mut Last) -> Result<(), EngineError> {
        if last.loaded {
            return Ok(());
        }
        let stores = self.clone();
        let loaded = blocking(move || {
            let Some(newest) = stores.workspace.page(None, 1)?.checkpoints.pop() else {
                return Ok((None, None));
            };
            let workspace = stores.workspace.load(&newest.id)?;
            let home = match home_of(&workspace) {
                Some(home) => Some(stores.home.load(&home)?),
                None => None,
            };
            Ok((Some(workspace), home))
        })
        .await;
        let (workspace, home) = match loaded {
            Ok(loaded) => loaded,
            // A broken newest checkpoint must not stop every later one: the next take reads
            // every file (no quick check), and its chunks are stored again where missing.
            Err(
                e @ EngineError::Checkpoint(
                    Error::Broken { .. } | Error::Missing { .. } | Error::Corrupt(_),
                ),
            ) => {
                tracing::warn!(error = %e, "the newest checkpoint is broken; the next is taken whole");
                (None, None)
            }
            Err(e) => return Err(e),
        };
        *last = Last {
            loaded: true,
            workspace,
            home,
        };
        Ok(())
    }

    /// Takes the trees' checkpoint; with `skip_unchanged`, one that changed nothing since the
    /// last is deleted again (`None`). Returns what it stored, its new bytes and its time.
    async fn take_locked(
        self: &Arc<Self>,
        last: &mut Last,
        trees: &Trees,
        turn: u64,
        reason: &'static str,
        skip_unchanged: bool,
    ) -> Result<Option<(CheckpointInfo, u64, Duration)>, EngineError> {
        let started = Instant::now();
        let stores = self.clone();
        let previous_ws = last.workspace.clone();
        let previous_home = last.home.clone();
        let (workspace_dir, home_dir) = match trees {
            Trees::Disk { workspace, home } => (workspace.clone(), home.clone()),
            Trees::Execd { client, .. } => {
                let label = json!({ "reason": reason, "turn": turn, "home": null });
                let (workspace, stats) =
                    take_from_execd(&self.workspace, client, previous_ws, label).await?;
                let (changed, bytes_new) = (stats.files_changed, stats.bytes_new);
                return self
                    .settle_take(
                        last,
                        workspace,
                        None,
                        changed,
                        bytes_new,
                        skip_unchanged,
                        started,
                    )
                    .await;
            }
        };
        let (workspace, home, bytes_new, changed) = blocking(move || {
            let (home, home_stats) = match &home_dir {
                Some(dir) => {
                    let (manifest, stats) = stores.home.take_labelled(
                        dir,
                        previous_home.as_ref(),
                        json!({ "reason": reason, "turn": turn }),
                    )?;
                    (Some(manifest), Some(stats))
                }
                None => (None, None),
            };
            let label = json!({
                "reason": reason,
                "turn": turn,
                "home": home.as_ref().map(|m| m.id.clone()),
            });
            let taken = stores
                .workspace
                .take_labelled(&workspace_dir, previous_ws.as_ref(), label);
            let (workspace, stats) = match taken {
                Ok(taken) => taken,
                Err(e) => {
                    if let Some(home) = &home {
                        let _ = stores.home.delete(&home.id);
                    }
                    return Err(e);
                }
            };
            let changed =
                stats.files_changed + home_stats.as_ref().map_or(0, |stats| stats.files_changed);
            let bytes_new = stats.bytes_new + home_stats.map_or(0, |stats| stats.bytes_new);
            Ok((workspace, home, bytes_new, changed))
        })
        .await?;
        self.settle_take(
            last,
            workspace,
            home,
            changed,
            bytes_new,
            skip_unchanged,
            started,
        )
        .await
    }

    /// A take's end: with `skip_unchanged`, one that changed nothing since the last is deleted
    /// again (`None`); else it becomes the last.
    #[allow(clippy::too_many_arguments)]
    async fn settle_take(
        self: &Arc<Self>,
        last: &mut Last,
        workspace: Manifest,
        home: Option<Manifest>,
        changed: u64,
        bytes_new: u64,
        skip_unchanged: bool,
        started: Instant,
    ) -> Result<Option<(CheckpointInfo, u64, Duration)>, EngineError> {
        if skip_unchanged && changed == 0 && last.workspace.is_some() {
            // The new manifests name only chunks the last one does; they still serve as the
            // quick check's fresher stat.
            let stores = self.clone();
            let (ws_id, home_id) = (workspace.id.clone(), home.as_ref().map(|m| m.id.clone()));
            blocking(move || {
                stores.workspace.delete(&ws_id)?;
                if let Some(home_id) = home_id {
                    stores.home.delete(&home_id)?;
                }
                Ok(())
            })
            .await?;
            return Ok(None);
        }
        let info = info_of(&workspace);
        last.workspace = Some(workspace);
        if home.is_some() {
            last.home = home;
        }
        Ok(Some((info, bytes_new, started.elapsed())))
    }
}

/// A checkpoint of the workspace of the execd behind `client`: it streams every entry, with
/// the content of the files `previous` cannot vouch for, straight into the store.
async fn take_from_execd(
    store: &Arc<CheckpointStore>,
    client: &ExecdClient,
    previous: Option<Manifest>,
    label: serde_json::Value,
) -> Result<(Manifest, warren_checkpoint::TakeStats), EngineError> {
    let known = previous.as_ref().map(Manifest::known).unwrap_or_default();
    let changes = client.changes(Tree::Workspace, &known).await.map_err(|e| {
        HandsError::Failed(format!("the hands' execd cannot stream its files: {e}"))
    })?;
    let changes = futures_util::TryStreamExt::map_err(changes, std::io::Error::other);
    let mut reader =
        tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(Box::pin(changes)));
    let store = store.clone();
    let taken = tokio::task::spawn_blocking(move || {
        store.take_streamed(&mut reader, previous.as_ref(), label)
    })
    .await
    .map_err(|e| EngineError::Internal(e.to_string()))?;
    taken.map_err(|e| match e {
        // What the execd sent is at fault, not the store: nothing was stored.
        Error::Corrupt(_) | Error::Unsafe { .. } => EngineError::Hands(HandsError::Failed(
            format!("the hands' execd streamed a checkpoint that cannot be taken: {e}"),
        )),
        e => e.into(),
    })
}

/// The `checkpoint` event of a stored checkpoint.
fn announce(
    session: &Session,
    turn: u64,
    reason: &str,
    info: &CheckpointInfo,
    bytes_new: u64,
    elapsed: Duration,
) {
    session.emit(
        (turn > 0).then_some(turn),
        EventBody::Checkpoint {
            id: info.id.clone(),
            reason: reason.into(),
            files_changed: info.files_changed,
            bytes_new,
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            changed_under: info.changed_under.clone(),
        },
    );
}

/// The home checkpoint a workspace checkpoint was taken with.
fn home_of(workspace: &Manifest) -> Option<String> {
    workspace.label["home"].as_str().map(str::to_owned)
}

fn info_of(manifest: &Manifest) -> CheckpointInfo {
    let created = chrono::DateTime::from_timestamp_millis(
        i64::try_from(manifest.created_at_ms).unwrap_or(i64::MAX),
    )
    .unwrap_or_default();
    CheckpointInfo {
        id: manifest.id.clone(),
        turn: manifest.label["turn"].as_u64().unwrap_or(0),
        created_at: created.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        files: manifest.summary.files,
        bytes: manifest.summary.bytes,
        files_changed: manifest.summary.files_changed,
        changed_under: manifest
            .changed_under
            .iter()
            .take(MAX_CHANGED_UNDER)
            .cloned()
            .collect(),
        reason: manifest.label["reason"]
            .as_str()
            .unwrap_or("turn")
            .to_owned(),
    }
}

/// Runs store work on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(EngineError::from)
}
