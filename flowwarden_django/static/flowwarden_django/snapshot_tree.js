/* The snapshot tree's "Load more": fetch the next page of snapshots as JSON and
   attach each node under its parent, with the rule the server uses: a parent's
   first child continues its chain, every later child starts a branch (a fork).
   Without JavaScript the button is a plain link to the next page. */
'use strict';
{
    function addBadge(node, name, label) {
        const badges = node.querySelector(':scope > .fw-card .fw-badges');
        if (!badges || badges.querySelector('.fw-badge-' + name)) {
            return;
        }
        const badge = document.createElement('span');
        badge.className = 'fw-badge fw-badge-' + name;
        badge.textContent = label;
        badges.appendChild(badge);
    }

    function newChain(node) {
        const chain = document.createElement('ol');
        chain.className = 'fw-chain';
        chain.appendChild(node);
        return chain;
    }

    function place(tree, node, parentId, forkLabel) {
        const parent = parentId ? document.getElementById('fw-node-' + parentId) : null;
        if (!parent) {
            tree.appendChild(newChain(node));
            return;
        }
        // The parent is drawn: the "parent on an earlier page" note is not needed.
        node.querySelectorAll(':scope > .fw-card .fw-detached').forEach((e) => e.remove());
        const chain = parent.parentElement;
        if (chain.lastElementChild === parent) {
            chain.appendChild(node);
            return;
        }
        let branches = parent.querySelector(':scope > ol.fw-branches');
        if (!branches) {
            branches = document.createElement('ol');
            branches.className = 'fw-branches';
            parent.appendChild(branches);
        }
        const branch = document.createElement('li');
        branch.className = 'fw-branch';
        branch.appendChild(newChain(node));
        branches.appendChild(branch);
        addBadge(parent, 'fork', forkLabel);
    }

    function loadMore(event) {
        const button = event.currentTarget;
        event.preventDefault();
        if (button.dataset.loading) {
            return;
        }
        button.dataset.loading = 'true';
        const tree = document.getElementById('flowwarden-snapshot-tree');
        const error = document.getElementById('flowwarden-tree-error');
        const count = document.getElementById('flowwarden-tree-count');
        error.textContent = '';
        const url = button.dataset.nodesUrl + '?after=' + encodeURIComponent(button.dataset.after);
        fetch(url, {credentials: 'same-origin', headers: {Accept: 'application/json'}})
            .then((response) => response.json().then((data) => {
                if (!response.ok || data.error) {
                    throw new Error(data.error || response.statusText);
                }
                return data;
            }))
            .then((data) => {
                const holder = document.createElement('template');
                for (const item of data.nodes) {
                    holder.innerHTML = item.html.trim();
                    place(tree, holder.content.firstElementChild, item.parent_id, button.dataset.forkLabel);
                }
                count.textContent = String(Number(count.textContent) + data.nodes.length);
                if (data.next_after === null) {
                    button.remove();
                } else {
                    button.dataset.after = data.next_after;
                    button.href = data.next_url;
                }
            })
            .catch((failure) => {
                error.textContent = failure.message;
            })
            .finally(() => {
                delete button.dataset.loading;
            });
    }

    window.addEventListener('load', () => {
        const button = document.getElementById('flowwarden-load-more');
        if (button) {
            button.addEventListener('click', loadMore);
        }
    });
}
